"""Backpropagation by hand: each layer's forward pass with its backward pass right beneath it.

Lecture note "BackPropagation for fully-connected and convolutional networks", sections 1-6, in
its notation and PyTorch's convention: a batch X is B x d_in, a weight W is d_out x d_in,
Z = X W^T, X' = sigma(Z). A backward function takes dQ/d(output) and returns dQ/d(input) (and
the parameters' gradients), for a scalar loss Q.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# -- section 1-2: one fully-connected layer --------------------------------------------------------


def linear_forward(X, W, b=None):
    """Z = X W^T (+ b)."""
    Z = X @ W.T
    return Z if b is None else Z + b


def linear_backward(dZ, X, W):
    """Given dQ/dZ, returns (dQ/dX, dQ/dW, dQ/db): dQ/dX = (dQ/dZ) W, dQ/dW = (dQ/dZ)^T X,
    dQ/db = column sums of dQ/dZ."""
    return dZ @ W, dZ.T @ X, dZ.sum(dim=0)


def relu_forward(Z):
    return Z.clamp(min=0)


def relu_backward(dXp, Z):
    """Elementwise through sigma: dQ/dZ = dQ/dX' * sigma'(Z), and ReLU' is 1 where Z > 0."""
    return dXp * (Z > 0).to(dXp.dtype)


def sigmoid_forward(Z):
    return 1.0 / (1.0 + torch.exp(-Z))


def sigmoid_backward(dXp, Z):
    s = sigmoid_forward(Z)
    return dXp * s * (1.0 - s)


def tanh_forward(Z):
    return torch.tanh(Z)


def tanh_backward(dXp, Z):
    return dXp * (1.0 - torch.tanh(Z) ** 2)


# -- section 3: the loss at the end ----------------------------------------------------------------


def check_labels(Z, y) -> None:
    """y: one int64 (or int32) class label in [0, classes) per row of Z, as F.cross_entropy asks."""
    t, c = torch.as_tensor(y), Z.shape[-1]
    if not (Z.dim() == 2 and t.shape == Z.shape[:1]
            and t.dtype in (torch.int32, torch.int64)
            and (not len(t) or 0 <= int(t.min()) <= int(t.max()) < c)):
        raise ValueError(f"y must be one integer class label in [0, {c}) per row of Z, shape "
                         f"{tuple(Z.shape)} (torch.long, as F.cross_entropy takes); got {t.dtype} "
                         f"y {t.tolist() if t.numel() <= 8 else 'of shape ' + str(tuple(t.shape))}")


def softmax_cross_entropy_forward(Z, y):
    """Mean over the batch of -log softmax(Z)[y]; computed stably by shifting each row's max."""
    check_labels(Z, y)
    shifted = Z - Z.max(dim=1, keepdim=True).values
    log_probs = shifted - shifted.exp().sum(dim=1, keepdim=True).log()
    return -log_probs[torch.arange(len(y)), y].mean()


def softmax_cross_entropy_backward(Z, y):
    """dQ/dZ = (softmax(Z) - onehot(y)) / B: the famous 'prediction minus target'."""
    check_labels(Z, y)
    probs = torch.softmax(Z, dim=1)
    probs[torch.arange(len(y)), y] -= 1.0
    return probs / len(y)


# -- sections 5-6: convolution as a matrix product -------------------------------------------------


def conv2d_forward(X, K, b=None, stride=1, padding=0):
    """Convolution (cross-correlation, as in PyTorch) of X (batch, C_in, H, W) with K (C_out, C_in,
    kh, kw): ``unfold`` (im2col) lays every kh x kw patch out as a column, and K flattened to
    (C_out, C_in kh kw) times the columns is the output, (batch, C_out, H_out, W_out)."""
    check_conv_input(X, K, stride, padding)
    batch, _, H, W = X.shape
    c_out, _, kh, kw = K.shape
    cols = F.unfold(X, (kh, kw), padding=padding, stride=stride)  # (batch, C_in kh kw, L)
    out = K.reshape(c_out, -1) @ cols  # (batch, C_out, L)
    h_out = (H + 2 * padding - kh) // stride + 1
    w_out = (W + 2 * padding - kw) // stride + 1
    out = out.reshape(batch, c_out, h_out, w_out)
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def check_conv_input(X, K, stride, padding) -> None:
    """X must be (batch, K's C_in, H, W), the padded image at least the kernel's size."""
    if (X.dim() != 4 or K.dim() != 4 or X.shape[1] != K.shape[1] or stride <= 0 or padding < 0
            or any(X.shape[i] + 2 * padding < K.shape[i] for i in (2, 3))):
        raise ValueError(f"conv2d needs X (batch, C_in, H, W) for a kernel (C_out, C_in, kh, kw) "
                         f"with H, W + 2 padding >= kh, kw, stride > 0, padding >= 0; got X "
                         f"{tuple(X.shape)}, kernel {tuple(K.shape)}, stride {stride}, padding "
                         f"{padding}")


def conv2d_backward(dOut, X, K, stride=1, padding=0):
    """Given dQ/dOut, return (dQ/dX, dQ/dK, dQ/db). dQ/dK is a product with the unfolded input (the
    columns of forward); dQ/dX is K^T times dQ/dOut, in column form, sent back through ``fold``,
    the adjoint of ``unfold``, which adds up the overlapping patches."""
    batch, _, H, W = X.shape
    c_out, _, kh, kw = K.shape
    cols = F.unfold(X, (kh, kw), padding=padding, stride=stride)  # (batch, C_in kh kw, L)
    d_out = dOut.reshape(batch, c_out, -1)  # (batch, C_out, L)
    dK = (d_out @ cols.transpose(1, 2)).sum(dim=0).reshape(K.shape)
    d_cols = K.reshape(c_out, -1).T @ d_out  # (batch, C_in kh kw, L)
    dX = F.fold(d_cols, (H, W), (kh, kw), padding=padding, stride=stride)
    return dX, dK, dOut.sum(dim=(0, 2, 3))


# -- checking a gradient ---------------------------------------------------------------------------


def finite_difference_gradient(f, x, eps: float = 1e-6):
    """Central differences (f(x + eps e_i) - f(x - eps e_i)) / 2 eps for every entry of x: two
    calls of f per entry, fine to check small layers, hopeless for training. f gets a copy of x."""
    if not (x.is_floating_point() and 0 < eps < float("inf")):
        raise ValueError(f"need a floating-point x and eps > 0, finite; got {x.dtype}, eps={eps!r}")
    x = x.detach().clone(memory_format=torch.contiguous_format)  # the copy f sees, nudged here
    flat, g = x.view(-1), torch.zeros(x.numel(), dtype=x.dtype, device=x.device)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + eps
        up = float(f(x))
        flat[i] = old - eps
        down = float(f(x))
        flat[i] = old
        g[i] = (up - down) / (2 * eps)
    return g.view(x.shape)


# -- section 4: a network, keeping each layer's input for the backward pass -----------------------


def _uniform(shape, fan_in, generator, dtype):
    """PyTorch's default initialisation: uniform on [-1/sqrt(fan_in), 1/sqrt(fan_in)]."""
    bound = 1.0 / fan_in**0.5 if fan_in > 0 else 0.0  # no inputs: zeros, as torch.nn.Linear(0, n)
    return (torch.rand(shape, generator=generator, dtype=dtype) * 2 - 1) * bound


class Linear:
    def __init__(self, d_in, d_out, generator=None, dtype=torch.float64):
        self.W = _uniform((d_out, d_in), d_in, generator, dtype)
        self.b = _uniform((d_out,), d_in, generator, dtype)

    def forward(self, X):
        self.X = X  # kept for the backward pass
        return linear_forward(X, self.W, self.b)

    def backward(self, dZ):
        dX, self.dW, self.db = linear_backward(dZ, self.X, self.W)
        return dX

    def parameters(self):
        return [self.W, self.b]

    def gradients(self):
        return [self.dW, self.db]


class Conv2d:
    def __init__(self, c_in, c_out, kernel, stride=1, padding=0, generator=None,
                 dtype=torch.float64):
        fan_in = c_in * kernel * kernel
        self.K = _uniform((c_out, c_in, kernel, kernel), fan_in, generator, dtype)
        self.b = _uniform((c_out,), fan_in, generator, dtype)
        self.stride, self.padding = stride, padding

    def forward(self, X):
        self.X = X
        return conv2d_forward(X, self.K, self.b, self.stride, self.padding)

    def backward(self, dOut):
        dX, self.dK, self.db = conv2d_backward(dOut, self.X, self.K, self.stride, self.padding)
        return dX

    def parameters(self):
        return [self.K, self.b]

    def gradients(self):
        return [self.dK, self.db]


class ParameterFree:
    """A layer with nothing to learn: no parameters, no gradients."""

    def parameters(self):
        return []

    def gradients(self):
        return []


class Activation(ParameterFree):
    """ReLU, sigmoid or tanh as a layer without parameters."""

    PAIRS = {"relu": (relu_forward, relu_backward), "sigmoid": (sigmoid_forward, sigmoid_backward),
             "tanh": (tanh_forward, tanh_backward)}

    def __init__(self, name):
        if name not in self.PAIRS:
            raise ValueError(f"unknown activation {name!r}: use one of {sorted(self.PAIRS)}")
        self.name = name
        self._forward, self._backward = self.PAIRS[name]

    def forward(self, Z):
        self.Z = Z
        return self._forward(Z)

    def backward(self, dXp):
        return self._backward(dXp, self.Z)


class Flatten(ParameterFree):
    def forward(self, X):
        self.shape = X.shape
        return X.reshape(X.shape[0], -1)

    def backward(self, dX):
        return dX.reshape(self.shape)


class Network:
    """Layers applied in order; backward runs them in reverse (section 4)."""

    def __init__(self, layers):
        self.layers = list(layers)

    def forward(self, X):
        for layer in self.layers:
            X = layer.forward(X)
        return X

    def loss(self, X, y):
        self.Z, self.y = self.forward(X), y
        return softmax_cross_entropy_forward(self.Z, y)

    def backward(self):
        """Fill every layer's gradients for the last ``loss`` call."""
        grad = softmax_cross_entropy_backward(self.Z, self.y)
        for layer in reversed(self.layers):
            grad = layer.backward(grad)
        return grad

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def gradients(self):
        return [g for layer in self.layers for g in layer.gradients()]


def to_torch_module(net: Network) -> torch.nn.Sequential:
    """The same network of torch.nn layers with the same weights (copied), to check autograd."""
    modules = []
    for layer in net.layers:
        if isinstance(layer, Linear):
            m = torch.nn.Linear(layer.W.shape[1], layer.W.shape[0], dtype=layer.W.dtype)
        elif isinstance(layer, Conv2d):
            c_out, c_in, k, _ = layer.K.shape
            m = torch.nn.Conv2d(c_in, c_out, k, stride=layer.stride, padding=layer.padding,
                                dtype=layer.K.dtype)
        elif isinstance(layer, Flatten):
            m = torch.nn.Flatten()
        else:
            m = {"relu": torch.nn.ReLU, "sigmoid": torch.nn.Sigmoid,
                 "tanh": torch.nn.Tanh}[layer.name]()
        for mine, theirs in zip(layer.parameters(), m.parameters(), strict=True):
            theirs.data.copy_(mine)  # weight and bias, in this order in both
        modules.append(m)
    return torch.nn.Sequential(*modules)


def small_cnn(seed: int = 0, channels: int = 8, hidden: int = 32, dtype=torch.float64) -> Network:
    """For 8x8 digits: conv 3x3 (padding 1), ReLU, flatten, linear, tanh, linear to 10 classes."""
    g = torch.Generator().manual_seed(seed)
    return Network([Conv2d(1, channels, 3, padding=1, generator=g, dtype=dtype),
                    Activation("relu"), Flatten(),
                    Linear(channels * 64, hidden, generator=g, dtype=dtype),
                    Activation("tanh"), Linear(hidden, 10, generator=g, dtype=dtype)])


def accuracy(logits, y) -> float:
    """Fraction of rows whose largest logit is the label."""
    return (logits.argmax(dim=1) == y).double().mean().item()
