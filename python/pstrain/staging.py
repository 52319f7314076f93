"""Host staging for tensors that live on a GPU.

The client reads gradients from and writes values into host memory. A model
on a CUDA device exchanges through host buffers, one per parameter: the
session's own arrays (``Client.values`` / ``Client.gradients``: the shared
region when the shard is co-located), page-locked with cudaHostRegister so
that the copies are DMA transfers that run asynchronously on the current
stream. A step is then::

    gradients:  device -> host buffer   (copy_(non_blocking=True), then one stream sync)
    exchange:   host buffers <-> PS      (push_pull, reading and writing them in place)
    values:     host buffer -> device   (copy_(non_blocking=True); the next kernels on
                                         the stream wait for it, the host does not)

The stream sync before the exchange also orders the previous step's value
uploads before the exchange overwrites their source. Where the buffers
cannot be page-locked (no CUDA, or a driver that refuses the mapping), the
same copies run synchronously.
"""

import torch

__all__ = ["HostStaging"]


class HostStaging:
    """Host buffers paired with device tensors, in order.

    ``host_values`` / ``host_gradients``: arrays or CPU tensors the client
    exchanges (kept alive here). ``pin``: page-lock them (default: when CUDA
    is available)."""

    def __init__(self, host_values, host_gradients, pin=None):
        self.values = [self._as_tensor(a) for a in host_values]
        self.gradients = [self._as_tensor(a) for a in host_gradients]
        self._registered = []
        if pin is None:
            pin = torch.cuda.is_available()
        self.pinned = bool(pin) and self._pin(self.values + self.gradients)

    @staticmethod
    def _as_tensor(array):
        return array if isinstance(array, torch.Tensor) else torch.from_numpy(array)

    def _pin(self, tensors):
        cudart = torch.cuda.cudart()
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            code = cudart.cudaHostRegister(tensor.data_ptr(),
                                           tensor.numel() * tensor.element_size(), 0)
            if int(code) != 0:
                self.close()
                return False
            self._registered.append(tensor)
        return True

    def close(self):
        """Unpins the buffers (also when the staging is collected)."""
        if self._registered:
            cudart = torch.cuda.cudart()
            for tensor in self._registered:
                cudart.cudaHostUnregister(tensor.data_ptr())
            self._registered = []

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: CUDA may be gone already
            pass

    def gradients_to_host(self, device_gradients):
        """Copies each device gradient into its host buffer and waits for the
        copies (and everything queued before them on the stream). A missing
        gradient (a parameter the step did not use) is pushed as zeros."""
        devices = set()
        for host, grad in zip(self.gradients, device_gradients):
            if grad is None:
                host.zero_()
                continue
            host.copy_(grad.detach().reshape(host.shape), non_blocking=self.pinned)
            devices.add(grad.device)
        for device in devices:
            if device.type == "cuda":
                torch.cuda.current_stream(device).synchronize()

    def values_to_device(self, device_values):
        """Queues each host value's copy into its device tensor."""
        with torch.no_grad():
            for host, value in zip(self.values, device_values):
                value.copy_(host.reshape(value.shape), non_blocking=self.pinned)
