"""The emulated device's queue (``runtime.emulation.EmulatedDevice.queued``): every operation of
a block passes through a ``TorchDispatchMode`` on its way to the CPU. A message (a ``c10d``
operation) or a read of a value first waits for the device; anything else runs at once and is
queued on the device with its FLOPs, counted by the formulas of torch's ``FlopCounterMode``."""

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class DeviceQueue(TorchDispatchMode):
    """Every operation of a :meth:`EmulatedDevice.queued` block: messages and reads wait for the
    device; the rest is queued with its FLOPs (torch's FlopCounterMode's formulas)."""

    def __init__(self, device):
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d" or func in READS:
            if func not in RECEIVES:  # a send needs its data; posting a receive needs nothing
                self.device.synchronize()
            out = func(*args, **kwargs)
            self.device.resume()
            return out
        wall, cpu = time.perf_counter(), time.thread_time()
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        self.device.issue(count(*args, **kwargs, out_val=out) if count else 0,
                          time.thread_time() - cpu, self.device.ready(wall, cpu))
        return out


# torch's FlopCounterMode counts attention for its GPU kernels (flash, memory-efficient, cuDNN)
# but has no formula for the CPU's: without these lines attention on a CPU rank would take no
# device time and count no FLOPs. The same formulas, for this process (the course's CPU ranks).
aten = torch.ops.aten
flop_registry.setdefault(aten._scaled_dot_product_flash_attention_for_cpu,
                         flop_registry[aten._scaled_dot_product_flash_attention])
flop_registry.setdefault(aten._scaled_dot_product_flash_attention_for_cpu_backward,
                         flop_registry[aten._scaled_dot_product_flash_attention_backward])
READS = {torch.ops.aten._local_scalar_dense.default}  # .item(): the host reads a result
RECEIVES = {torch.ops.c10d.recv_.default, torch.ops.c10d.recv_any_source_.default}
