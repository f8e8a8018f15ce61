"""Mixture of experts and expert parallelism: many feed-forward networks, each token sent to few.

Lecture: long sequences and experts. A mixture-of-experts block (GShard, Lepikhin et al. 2020;
Switch Transformer, Fedus et al. 2021; Mixtral, Jiang et al. 2024) replaces the feed-forward
network of a Transformer block by E of them and a **router**, a linear map giving each token a
probability per expert. Each token goes to its top k experts (k = 1 in Switch, 2 in GShard and
Mixtral), and their outputs are summed, weighted by the **gates** (the chosen probabilities,
renormalised to sum to 1 when k > 1). The parameters grow E-fold; a token's FLOPs only k-fold.

* **Capacity.** An expert takes at most C = ceil(factor x tokens x k / E) tokens of a batch, so
  that every expert's input has one fixed size. First choices are served before second choices,
  in token order; a token past an expert's capacity is **dropped** there (it adds nothing; in a
  Transformer the residual connection carries it on).
* **Load balancing.** Switch's auxiliary loss E sum_i f_i P_i, with f_i the share of the
  assignments that went to expert i and P_i its mean router probability, is smallest when the
  tokens spread evenly.
* **Expert parallelism.** The experts are spread over the ranks (E / ep each). Every rank routes
  its own tokens, and an all-to-all sends each expert its tokens (the ``dispatch``), a second one
  brings the outputs home (the ``combine``). The capacity makes every message one size.

Tokens are rows of x: (tokens, d_model). Rank functions take ``group`` (default: all ranks) and
compute on the device their tensors are on.
"""

from __future__ import annotations

import math
import numbers
import time

import torch
import torch.distributed as dist

from course_lib.collectives import all_to_all
from course_lib.model_shapes import check_positive
from course_lib.models import feed_forward, tiny_gpt
from course_lib.overlap import all_reduce_as_one_bucket
from course_lib.runtime.devices import device
from course_lib.runtime.timing import synchronize
from course_lib.training import is_whole


def route(logits, k: int):
    """(experts, gates, probabilities): each token's top ``k`` experts (tokens, k), their gates
    (renormalised to sum to 1 when k > 1) and every expert's probability (tokens, E)."""
    if logits.dim() != 2:
        raise ValueError(f"route takes logits (tokens, experts), a row a token (a mixture's x is "
                         f"(tokens, d_model)), got logits of shape {tuple(logits.shape)}")
    if not is_whole(k) or not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be a whole number between 1 and the number of experts "
                         f"({logits.shape[-1]}), got {k!r}")
    probs = torch.softmax(logits, dim=-1)
    gates, experts = probs.topk(k, dim=-1)
    if k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return experts, gates, probs


def capacity(tokens: int, experts: int, k: int, factor: float) -> int:
    """Tokens one expert takes from a batch of ``tokens``: ceil(factor x tokens x k / E)."""
    if isinstance(factor, bool) or not (isinstance(factor, numbers.Real) and 0 < factor < math.inf):
        raise ValueError(f"the capacity factor must be positive and finite, got {factor!r}")
    counts = (tokens, experts, k)
    whole = all(map(is_whole, counts))
    if not (whole and experts >= 1 and 1 <= k <= experts and tokens >= 0):
        raise ValueError(f"need experts >= 1, k >= 1 and tokens >= 0, whole numbers, and "
                         f"1 <= k <= experts; got experts {experts!r}, k {k!r}, tokens {tokens!r}")
    return max(1, math.ceil(factor * tokens * k / experts))


def assign_slots(experts, num_experts: int, cap: int):
    """Each assignment's slot in its expert's input (tokens, k), or -1 where the expert is full:
    all first choices in token order, then all second choices, and so on."""
    slots = torch.full_like(experts, -1)
    filled = torch.zeros(num_experts, dtype=torch.long, device=experts.device)
    for choice in range(experts.shape[1]):
        chosen = experts[:, choice]
        one_hot = torch.nn.functional.one_hot(chosen, num_experts)
        before = (one_hot.cumsum(dim=0) - one_hot)[torch.arange(len(chosen)), chosen]
        slot = filled[chosen] + before  # how many this expert took before this token
        slots[:, choice] = torch.where(slot < cap, slot, -1)
        filled += one_hot.sum(dim=0)
    return slots


def balancing_loss(probs, experts, num_experts: int):
    """Switch Transformer's auxiliary loss E sum_i f_i P_i (1 when the load is even)."""
    share = torch.bincount(experts.reshape(-1), minlength=num_experts) / experts.numel()
    return num_experts * (share.to(probs.dtype) * probs.mean(dim=0)).sum()


def dispatch(x, experts, slots, num_experts: int, cap: int):
    """Each expert's input, (E, capacity, d): the tokens in their slots, zeros where free."""
    out = x.new_zeros(num_experts, cap, x.shape[-1])
    token, choice = (slots >= 0).nonzero(as_tuple=True)
    return out.index_put((experts[token, choice], slots[token, choice]), x[token])


def combine(expert_out, experts, slots, gates):
    """Each token's output: its kept experts' outputs, weighted by their gates."""
    kept = slots >= 0
    picked = expert_out[experts, slots.clamp(min=0)]  # (tokens, k, d)
    return (picked * (gates * kept)[..., None]).sum(dim=1)


class MixtureOfExperts(torch.nn.Module):
    """A router and ``num_experts`` feed-forward networks (``models.feed_forward``); forward
    returns (output, balancing loss) and keeps the last batch's ``stats``."""

    def __init__(self, d_model: int = 16, d_hidden: int = 32, num_experts: int = 4, k: int = 2,
                 capacity_factor: float = 1.25, seed: int = 0, dtype=torch.float32):
        super().__init__()
        check_positive("MixtureOfExperts", d_model=d_model, d_hidden=d_hidden,
                       num_experts=num_experts)
        capacity(0, num_experts, k, capacity_factor)  # k and the factor refused now, not later
        torch.manual_seed(seed)
        self.router = torch.nn.Linear(d_model, num_experts, bias=False, dtype=dtype)
        self.experts = torch.nn.ModuleList(
            feed_forward(d_model, d_hidden, seed=seed + 1 + e, dtype=dtype)
            for e in range(num_experts))
        self.num_experts, self.k, self.capacity_factor = num_experts, k, capacity_factor
        self.stats: dict = {}

    def run_experts(self, inputs):
        """(E, capacity, d) -> each expert applied to its own rows (one process: all of them)."""
        pairs = zip(self.experts, inputs, strict=True)
        return torch.stack([expert(rows) for expert, rows in pairs])

    def forward(self, x):
        experts, gates, probs = route(self.router(x), self.k)
        cap = capacity(len(x), self.num_experts, self.k, self.capacity_factor)
        slots = assign_slots(experts, self.num_experts, cap)
        expert_out = self.run_experts(dispatch(x, experts, slots, self.num_experts, cap))
        self.stats = {"tokens_per_expert": torch.bincount(experts.reshape(-1),
                                                          minlength=self.num_experts).tolist(),
                      "dropped": int((slots < 0).sum()), "capacity": cap}
        return combine(expert_out, experts, slots, gates), balancing_loss(probs, experts,
                                                                          self.num_experts)


class ExpertParallel(MixtureOfExperts):
    """The same block with its experts spread over the ranks of ``group``: this rank keeps
    experts [rank E / ep, (rank + 1) E / ep) and the router (replicated); between routing and
    combining, two all-to-alls move the tokens to their experts and back."""

    def __init__(self, moe: MixtureOfExperts, group=None):
        torch.nn.Module.__init__(self)
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        if moe.num_experts % ep:
            raise ValueError(f"{moe.num_experts} experts do not divide among {ep} ranks")
        self.local = moe.num_experts // ep
        self.router = moe.router
        self.experts = moe.experts[rank * self.local:(rank + 1) * self.local]
        self.num_experts, self.k, self.capacity_factor = moe.num_experts, moe.k, \
            moe.capacity_factor
        self.group, self.stats = group, {}
        self.sent = {"messages": 0, "bytes": 0, "seconds": []}

    def run_experts(self, inputs):
        ep = dist.get_world_size(self.group)
        cap, d = inputs.shape[1:]
        arrived = self.exchange(inputs.reshape(ep, self.local, cap, d))  # dispatch
        by_expert = arrived.transpose(0, 1).reshape(self.local, ep * cap, d)
        pairs = zip(self.experts, by_expert, strict=True)
        out = torch.stack([expert(rows) for expert, rows in pairs])
        back = out.reshape(self.local, ep, cap, d).transpose(0, 1)
        return self.exchange(back).reshape(self.num_experts, cap, d)  # combine

    def exchange(self, slices):
        """:func:`all_to_all` of ``slices`` (one per rank), adding to ``sent`` its messages and
        the bytes this rank sent, and appending the seconds it took (the device synchronised)."""
        slices = slices.contiguous()  # packing the slices is compute, not the message
        synchronize(slices.device)
        start = time.perf_counter()
        out = all_to_all(slices, self.group)
        synchronize(slices.device)
        self.sent["seconds"].append(time.perf_counter() - start)
        self.sent["messages"] += 1
        self.sent["bytes"] += slices.numel() * slices.element_size() * (len(slices) - 1) \
            // len(slices)
        return out


class ExpertFeedForward(torch.nn.Module):
    """A transformer block's MLP as a mixture of experts: (batch, tokens, d) in and out, each
    token routed on its own; the balancing loss of the last call kept in ``aux``."""

    def __init__(self, moe: MixtureOfExperts):
        super().__init__()
        self.moe, self.aux = moe, None

    def forward(self, x):
        y, self.aux = self.moe(x.reshape(-1, x.shape[-1]))
        return y.reshape(x.shape)


def with_experts(gpt, num_experts: int, k: int = 1, seed: int = 0):
    """``gpt`` (a ``models.TinyGPT``) with every block's MLP replaced by ``num_experts`` experts
    of the same shape, each token sent to its top ``k``. Their capacity is every token (factor
    E): nothing is dropped, so a token's output does not depend on the others in its batch, and
    any split of the batch computes what one process does. The price: every expert computes on a
    buffer of tokens x k rows, mostly zeros, so the block costs E k times a dense MLP (not k
    times), and expert parallelism's all-to-alls carry E times the bytes a capacity factor of 1
    would. Block i's router and experts take seeds of their own (none shared with another)."""
    if num_experts < 1 or not 1 <= k <= num_experts:
        raise ValueError(f"need at least one expert and 1 <= k <= experts, got {num_experts} "
                         f"experts and k = {k}")
    for i, block in enumerate(gpt.blocks):  # seeds i (E + 1) + 0..E: the router, then experts
        d, dtype = block.fc1.in_features, block.fc1.weight.dtype
        block.mlp = ExpertFeedForward(MixtureOfExperts(
            d, 4 * d, num_experts, k, capacity_factor=float(num_experts),
            seed=1000 * (seed + 1) + i * (num_experts + 1), dtype=dtype))
        del block.fc1, block.fc2
    return gpt


def model_of(shape: dict, seed: int, dtype):
    """``models.tiny_gpt`` of ``shape`` (``train_gpt.MODEL``'s keys: its sizes, ``experts`` and
    ``top_k``), its MLPs :func:`with_experts` when experts > 0."""
    shape = dict(shape)
    experts, k = shape.pop("experts"), shape.pop("top_k")
    gpt = tiny_gpt(**shape, seed=seed, dtype=dtype)
    return with_experts(gpt, experts, k, seed) if experts else gpt


def spread_experts(blocks, group) -> list:
    """Expert parallelism in place: each block of ``blocks`` that holds experts keeps only this
    rank's share of them (:class:`ExpertParallel` over ``group``). Returns the parameters of the
    experts this rank kept: their gradients hold every rank's tokens' share, see
    :func:`average_expert_gradients`."""
    kept = []
    for block in blocks:
        if block.experts is not None:
            block.experts.moe = ExpertParallel(block.experts.moe, group)
            kept += list(block.experts.moe.experts.parameters())
    return kept


def average_expert_gradients(params, ep: int, replicas=None) -> None:
    """Each kept expert's gradient, after backward, is the sum over the ``ep`` ranks whose
    tokens it served of their losses' gradients; data parallelism wants the mean over all data
    ranks: divide by ep, then average over ``replicas``, the ranks that hold the same experts
    (None: no other)."""
    for g in [p.grad for p in params if p.grad is not None]:
        g.div_(ep)
    if replicas is not None and dist.get_world_size(replicas) > 1:
        all_reduce_as_one_bucket(params, replicas)


def run_expert_parallel(moe: MixtureOfExperts, x, d_out, group=None) -> dict:
    """On each rank: route this rank's equal share of the tokens ``x`` through ``moe``, its
    experts spread over the ranks, and backpropagate the share of ``d_out``. Returns the output,
    the gradients of this rank's experts and the router's (summed over the ranks, as data
    parallelism would; None where frozen), the stats and what was sent."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    if len(x) % ep:
        raise ValueError(f"{len(x)} tokens do not split evenly over {ep} ranks")
    n = len(x) // ep
    layer = ExpertParallel(moe.to(device(group)), group)
    mine = slice(rank * n, (rank + 1) * n)
    y, aux = layer(x[mine].to(device(group)))
    y.backward(d_out[mine].to(device(group)))
    router_grad = layer.router.weight.grad  # None where frozen (alike on every rank)
    if router_grad is not None:
        dist.all_reduce(router_grad := router_grad.clone(), group=group)
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    return {"out": y.detach().cpu(), "aux": aux.item(), "stats": layer.stats, "sent": layer.sent,
            "expert_grads": [[cpu(p.grad) for p in e.parameters()] for e in layer.experts],
            "router_grad": cpu(router_grad)}


def train_with_experts(x, y, *, balance: float, steps: int = 60, seed: int = 0,
                       num_experts: int = 4, k: int = 1, width: int = 16, batch: int = 128,
                       lr: float = 1e-2) -> dict:
    """A small classifier with a mixture of experts in its middle (features -> ReLU(linear) ->
    plus the mixture's output -> linear -> classes), trained in one process by Adam for
    ``steps`` batches of ``batch`` rows on the cross-entropy plus ``balance`` x the balancing
    loss (no capacity limit: nothing dropped). Returns each step's tokens per expert
    (``loads``: steps x experts) and ``losses`` (the cross-entropy)."""
    if not (is_whole(steps) and is_whole(batch) and steps >= 1 and batch >= 1):
        raise ValueError(f"steps and batch must be whole numbers from 1, got {steps!r}, {batch!r}")
    torch.manual_seed(seed)
    first, last = torch.nn.Linear(x.shape[1], width), torch.nn.Linear(width, int(y.max()) + 1)
    moe = MixtureOfExperts(width, 2 * width, num_experts, k, capacity_factor=float(num_experts),
                           seed=seed)
    params = [*first.parameters(), *last.parameters(), *moe.parameters()]
    adam = torch.optim.Adam(params, lr=lr)
    rows = torch.Generator().manual_seed(seed)
    loads, losses = [], []
    for _ in range(steps):
        pick = torch.randint(0, len(x), (batch,), generator=rows)
        h = torch.relu(first(x[pick].float()))
        mixed, aux = moe(h)
        loss = torch.nn.functional.cross_entropy(last(h + mixed), y[pick])
        adam.zero_grad()
        (loss + balance * aux).backward()
        adam.step()
        loads.append(moe.stats["tokens_per_expert"])
        losses.append(loss.item())
    return {"loads": torch.tensor(loads), "losses": losses}
