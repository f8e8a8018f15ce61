"""The course's networks, in one place: every lesson builds its model here.

* :func:`mlp`: a fully-connected network of any sizes and activation (lecture note on
  backpropagation, section 3) -- the digits MLP of lessons 4, 7 and 9, the deep MLP whose many
  small gradients show DDP's buckets, the network lesson 5 cuts into pipeline stages;
* :func:`digits_cnn`: the small CNN of slides part 3, trained with data parallelism;
* :func:`feed_forward`: a transformer's MLP block, which Megatron-LM splits across ranks;
* :class:`FlatMLP`: an MLP whose parameters are one flat vector, for federated learning, where
  averaging models, control variates and server optimisers are vector arithmetic;
* :func:`tiny_gpt`: a small GPT-style transformer (lesson 10), big enough that its gradients
  take visible time to all-reduce on two cores.

(Lesson 1's CNN of hand-written layers, ``small_cnn``, lives with those layers in
:mod:`course_lib.backprop`: this module stands below the lessons.)

The same ``seed`` gives the same weights in every process, so ranks can build their replica
(or their piece) of one model without sending it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.training import check_whole


def mlp(sizes, *, activation=torch.nn.ReLU, flatten: bool = False, seed: int = 0,
        dtype=torch.float32) -> torch.nn.Sequential:
    """Linear layers from ``sizes[0]`` inputs through the hidden widths to ``sizes[-1]`` outputs,
    with ``activation`` between them; ``flatten`` first flattens image inputs."""
    if len(sizes) < 2:
        raise ValueError(f"an MLP needs at least input and output sizes, got {sizes!r}")
    torch.manual_seed(seed)
    layers = [torch.nn.Flatten()] if flatten else []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(torch.nn.Linear(a, b, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(activation())
    return torch.nn.Sequential(*layers)


def digits_mlp(width: int = 128, depth: int = 2, seed: int = 0,
               inputs: int = 64) -> torch.nn.Sequential:
    """The digits MLP: ``depth`` hidden ReLU layers of ``width`` units, 10 classes."""
    check_whole("width", width), check_whole("depth", depth, least=0)
    return mlp((inputs, *[width] * depth, 10), seed=seed)


def deep_mlp(depth: int = 24, width: int = 128, seed: int = 0) -> torch.nn.Sequential:
    """``depth`` linear layers for (flattened) digits: many small weight tensors, which is what
    DDP's gradient buckets are for."""
    check_whole("depth", depth), check_whole("width", width)
    return mlp((64, *[width] * (depth - 1), 10), flatten=True, seed=seed)


def digits_cnn(seed: int = 0, width: int = 16, dtype=torch.float32) -> torch.nn.Sequential:
    """The small CNN for 8x8 digits: two 3x3 convolutions (width, 2 width channels), ReLU, then
    a linear layer to 10 classes. ``width`` sets how much computation a step costs."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, width, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(width, 2 * width, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(2 * width * 64, 10)).to(dtype)


def feed_forward(d_model: int = 16, d_hidden: int = 64, seed: int = 0,
                 dtype=torch.float64) -> torch.nn.Sequential:
    """A transformer's MLP block Y = GeLU(X A) B: ``fc1`` (d_model -> d_hidden), GeLU, ``fc2``
    (d_hidden -> d_model)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(d_model, d_hidden, dtype=dtype))
    model.add_module("act", torch.nn.GELU())
    model.add_module("fc2", torch.nn.Linear(d_hidden, d_model, dtype=dtype))
    return model


@dataclass(frozen=True)
class FlatMLP:
    """A ReLU MLP of layer ``sizes`` whose weights and biases are one flat float64 vector w.

    Its backward pass is lesson 1's, written out (several times faster than autograd for a model
    this small). float64 makes sums taken in different orders (one process, several ranks)
    agree to about 1e-12.
    """

    sizes: tuple = (64, 32, 10)

    def __post_init__(self):
        if len(self.sizes) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                      for n in self.sizes):
            raise ValueError(f"FlatMLP's sizes are two or more layer widths, each a whole number "
                             f"of at least 1; got {self.sizes!r}")

    @property
    def num_parameters(self) -> int:
        return sum((a + 1) * b for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True))

    def init(self, seed: int = 0) -> torch.Tensor:
        """PyTorch's default initialisation of each layer, U(-1/sqrt(fan_in), +), flattened."""
        g = torch.Generator().manual_seed(seed)
        pieces = []
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            bound = 1 / math.sqrt(a)
            pieces.append((torch.rand(b * a + b, generator=g, dtype=torch.float64) * 2 - 1)
                          * bound)
        return torch.cat(pieces)

    def layers(self, w):
        """(weight, bias) views of each layer inside the flat vector w."""
        if w.dim() != 1 or w.numel() != self.num_parameters:
            raise ValueError(f"w must be a flat vector of this MLP's {self.num_parameters} "
                             f"parameters, got shape {tuple(w.shape)}")
        start, layers = 0, []
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            layers.append((w[start:start + a * b].view(b, a), w[start + a * b:start + a * b + b]))
            start += a * b + b
        return layers

    def forward(self, w, x, keep_inputs: list | None = None):
        """The logits; with ``keep_inputs`` (a list) each layer's input is kept for backward."""
        h = x.to(w.dtype)
        layers = self.layers(w)
        for i, (weight, bias) in enumerate(layers):
            if keep_inputs is not None:
                keep_inputs.append(h)
            h = h @ weight.T + bias
            if i < len(layers) - 1:
                h = torch.relu(h)
        return h

    def loss_and_gradient(self, w, x, y):
        """Mean cross-entropy on (x, y) and its gradient with respect to w, by backpropagation."""
        if x.dim() != 2 or y.dim() != 1 or len(x) != len(y) or len(y) == 0:
            raise ValueError(f"x must be a batch of rows and y one label per row: got x of shape "
                             f"{tuple(x.shape)} and y of shape {tuple(y.shape)}")
        if y.min() < 0 or y.max() >= self.sizes[-1]:
            raise ValueError(f"labels must lie in 0..{self.sizes[-1] - 1}, got "
                             f"{y.min().item()}..{y.max().item()}")
        inputs = []
        log_p = torch.log_softmax(self.forward(w, x, inputs), dim=1)
        rows = torch.arange(len(y), device=w.device)
        loss = -log_p[rows, y].mean()
        delta = log_p.exp()
        delta[rows, y] -= 1
        delta /= len(y)  # dQ/dZ of the last layer
        grads = []
        layers = self.layers(w)
        for i in range(len(layers) - 1, -1, -1):
            grads.append(torch.cat([(delta.T @ inputs[i]).flatten(), delta.sum(dim=0)]))
            if i > 0:  # back through the ReLU that made inputs[i]
                delta = (delta @ layers[i][0]) * (inputs[i] > 0)
        return loss.item(), torch.cat(grads[::-1])

    def loss_and_gradient_batched(self, W, X, Y, weights):
        """:meth:`loss_and_gradient` of k models at once, each on its own batch: ``W`` (k, d)
        stacks the models, ``X`` (k, b, inputs) and ``Y`` (k, b) their batches, ``weights``
        (k, b) each row's weight in its model's loss (1 / batch size for a row, 0 for padding
        that evens out the batch sizes). The same backward pass, each product batched over the
        k models. Returns the k losses and the (k, d) gradients."""
        k, inputs = len(W), []
        layers = []
        start = 0
        for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            layers.append((W[:, start:start + a * b].reshape(k, b, a),
                           W[:, start + a * b:start + a * b + b]))
            start += a * b + b
        h = X.to(W.dtype)
        for i, (weight, bias) in enumerate(layers):
            inputs.append(h)
            h = torch.baddbmm(bias[:, None, :], h, weight.transpose(1, 2))
            if i < len(layers) - 1:
                h = torch.relu(h)
        log_p = torch.log_softmax(h, dim=2)
        loss = -(log_p.gather(2, Y[..., None])[..., 0] * weights).sum(dim=1)
        delta = log_p.exp()
        delta.scatter_add_(2, Y[..., None], -torch.ones_like(delta[..., :1]))
        delta *= weights[..., None]  # dQ/dZ of the last layer, each row with its weight
        grads = []
        for i in range(len(layers) - 1, -1, -1):
            grads.append(torch.cat([(delta.transpose(1, 2) @ inputs[i]).flatten(1),
                                    delta.sum(dim=1)], dim=1))
            if i > 0:  # back through the ReLU that made inputs[i]
                delta = (delta @ layers[i][0]) * (inputs[i] > 0)
        return loss, torch.cat(grads[::-1], dim=1)

    def accuracy(self, w, x, y) -> float:
        with torch.no_grad():
            return (self.forward(w, x).argmax(dim=1) == y).double().mean().item()


DIGITS_MLP = FlatMLP()  # 64 pixels, 32 hidden units, 10 classes


class Block(torch.nn.Module):
    """One pre-norm transformer block: causal self-attention, then an MLP of 4 d_model, each
    added to the residual stream (GPT-2's layout). ``mlp``: a module that replaces the MLP
    (lesson 13's experts, ``experts.with_experts``); None: fc1 and fc2."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.norm2 = torch.nn.LayerNorm(d_model)
        self.fc1 = torch.nn.Linear(d_model, 4 * d_model)
        self.fc2 = torch.nn.Linear(4 * d_model, d_model)
        self.mlp = None

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        if self.mlp is not None:
            return x + self.mlp(self.norm2(x))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyGPT(torch.nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and a linear head to the
    vocabulary. ``forward(tokens)`` gives logits of shape (batch, time, vocab)."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, context: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.position = torch.nn.Embedding(context, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab)
        self.checkpointing = False  # lesson 10: recompute each block's activations in backward

    def forward(self, tokens):
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1],
                                                            device=tokens.device))
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))


def tiny_gpt(vocab: int = 96, d_model: int = 128, layers: int = 4, heads: int = 4,
             context: int = 64, seed: int = 0, dtype=torch.float32) -> TinyGPT:
    """A small GPT-style language model (lesson 10): with the defaults about 0.8 M parameters,
    3.2 MB of float32 gradients in 4 blocks of 12 weight tensors each."""
    for name, value in (("vocab", vocab), ("d_model", d_model), ("layers", layers),
                        ("heads", heads), ("context", context)):
        check_whole(name, value)
    if d_model % heads:
        raise ValueError(f"d_model ({d_model}) must be a multiple of heads ({heads})")
    torch.manual_seed(seed)
    return TinyGPT(vocab, d_model, layers, heads, context).to(dtype)
