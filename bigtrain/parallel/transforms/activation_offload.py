"""Activation offload (``parallel.offload_activations``): what a decoder block saves for backward waits in host
memory between its forward and its backward.

Each decoder block is wrapped so that autograd's saved-tensor hooks run around its forward (outside activation
checkpointing's wrapper, so with ``activation_checkpointing: full`` what moves is the input each checkpointed block
keeps: DeepSpeed ALST's offloaded checkpoints). Packing a saved tensor copies it into a host buffer; the device
tensor is let go when the block's forward ends (held until then, so that no later tensor can reuse its storage while
it is the key of a copy). Unpacking copies it back. When backward first needs a block, that block's tensors are
fetched together with those of the block that ran before it (the one backward needs next), and each fetched tensor is
dropped from the device again once its last unpack took it.

On CUDA the host buffers are pinned and every copy runs on a side stream (ordered after the compute that made the
tensor, with ``record_stream`` so the allocator does not reuse memory under a running copy): the copy-out of block i
overlaps the forward of block i+1, the copy-in of block i-1 the backward of block i. The planner times the part of
the copies that compute does not hide (``cost.activation_offload_seconds``).

Not moved: parameters (a saved weight is recognised by its storage; FSDP2 and ZeRO-3 gather it again for backward)
and tensors under ``MIN_BYTES`` (RoPE's tables of a short row, norms' per-token scalars at tiny widths: their copies
would cost launches and save nothing). A tensor saved several times in one block (the same view of a norm's output
taken by q, k and v) is copied once. On a CPU device the copy is still made (so the tests check the round trip's
numerics); the simulator offloads to the meta device, so its memory tracker sees what a GPU run keeps on the device.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper
from torch.distributed.tensor import DTensor

from bigtrain.parallel.transforms.activation_checkpoint import hf_name
from bigtrain.parallel.transforms.base import BuildContext, BuiltModel, Transform

MIN_BYTES = 1024


def _storage_id(tensor: torch.Tensor) -> int:
    """The identity of a tensor's storage (its C++ object: also distinct for fake and meta tensors)."""
    return tensor.untyped_storage()._cdata


def _parameter_storages(block: nn.Module) -> set[int]:
    """Storages of the block's parameters as they are now (FSDP2's and ZeRO-3's gathered ones during the forward)."""
    ids = set()
    for p in block.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        with contextlib.suppress(RuntimeError, NotImplementedError):  # a subclass without a plain storage (NF4)
            ids.add(_storage_id(local))
    return ids


def _copied_base(tensor: torch.Tensor) -> torch.Tensor:
    """What is copied for a saved tensor: the dense tensor it views (a view is rebuilt from it by ``as_strided``),
    or the tensor itself."""
    base = tensor._base
    # empty_like keeps the strides of a dense, non-overlapping layout only: anything else is copied as it is seen
    if base is None or base.dtype != tensor.dtype or not _dense(base):
        return tensor
    return base


def _dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements fill its memory without gaps or overlaps, in some order of its dimensions."""
    expected = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride(), strict=True), key=lambda dim: dim[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


@dataclass(eq=False)
class _BlockCall:
    """What one forward of one block offloaded: host copies, by index, and the device copies fetched back."""

    host: list[torch.Tensor] = field(default_factory=list)
    devices: list[torch.device] = field(default_factory=list)
    users: list[int] = field(default_factory=list)  # handles per copy still to be unpacked
    keys: dict[tuple, int] = field(default_factory=dict)  # tensor identity -> index (one copy per tensor)
    held: list[torch.Tensor] | None = field(default_factory=list)  # device tensors, until the forward ends
    fetched: dict[int, torch.Tensor] | None = None  # device copies fetched for backward (None: not fetched yet)
    ready: Any = None  # CUDA event: the fetch has landed


class ActivationOffloader:
    """The host side of one model's activation offload: its block calls in forward order and its CUDA side stream.
    One per built model (the wrappers of its blocks share it)."""

    def __init__(self, host_device: torch.device) -> None:
        self.host_device = host_device
        self._calls: list[weakref.ref[_BlockCall]] = []
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self.copied_bytes = 0  # bytes copied out so far (what the tests and the planner's host term compare)

    @contextlib.contextmanager
    def offloading(self, block: nn.Module) -> Iterator[None]:
        """Offload what ``block``'s forward saves for backward, while this context is open."""
        call = _BlockCall()
        self._calls = [ref for ref in self._calls if ref() is not None] + [weakref.ref(call)]

        def pack(tensor: torch.Tensor) -> Any:
            if tensor.numel() * tensor.element_size() < MIN_BYTES or _storage_id(tensor) in _parameter_storages(block):
                return tensor
            # one copy per base tensor: views of it (the same norm output seen by q, k and v; attention's output
            # and the o_proj input viewing it) are rebuilt from it, so the host holds what the device would have
            base = _copied_base(tensor)
            key = (_storage_id(base), base.storage_offset(), tuple(base.shape), base.stride(), base._version)
            index = call.keys.get(key)
            if index is None:
                index = call.keys[key] = len(call.host)
                call.host.append(self._copy_out(base))
                call.devices.append(base.device)
                call.users.append(0)
                call.held.append(base)
                self.copied_bytes += base.numel() * base.element_size()
            call.users[index] += 1
            if base is tensor:
                return call, index, None
            return call, index, (tuple(tensor.shape), tensor.stride(), tensor.storage_offset() - base.storage_offset())

        def unpack(packed: Any) -> torch.Tensor:
            if isinstance(packed, torch.Tensor):
                return packed
            owner, index, view = packed
            tensor = self._take(owner, index)
            return tensor if view is None else tensor.as_strided(*view)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        call.held = None

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def _copy_out(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.host_device.type == "meta":  # the simulator: shapes only
            return torch.empty_like(tensor, device="meta")
        if tensor.device.type != "cuda":
            return tensor.detach().to(self.host_device, copy=True)
        stream = self._stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))  # after the kernel that made the tensor
        with torch.cuda.stream(stream):
            host = torch.empty_like(tensor, device=self.host_device, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(stream)  # its memory is not reused before the copy has read it
        return host

    def _fetch(self, call: _BlockCall) -> None:
        """Start copying a block call's tensors back to the device."""
        call.fetched = {}
        cuda = [d for d in call.devices if d.type == "cuda"]
        stream = self._stream(cuda[0]) if cuda else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for index, (host, device) in enumerate(zip(call.host, call.devices, strict=True)):
                if call.users[index] == 0:
                    continue
                if self.host_device.type == "meta":
                    call.fetched[index] = torch.empty_like(host, device=device)
                elif host.device == device:
                    call.fetched[index] = host
                else:
                    call.fetched[index] = host.to(device, non_blocking=stream is not None)
            if stream is not None:
                call.ready = stream.record_event()

    def _previous(self, call: _BlockCall) -> _BlockCall | None:
        """The block call made just before ``call`` in forward order (the next one backward reaches)."""
        calls = [ref() for ref in self._calls]
        position = next((i for i, c in enumerate(calls) if c is call), 0)
        return calls[position - 1] if position > 0 else None

    def _take(self, call: _BlockCall, index: int) -> torch.Tensor:
        if call.fetched is None:
            self._fetch(call)
            before = self._previous(call)
            if before is not None and before.fetched is None:
                self._fetch(before)  # prefetch: its copy-in overlaps this block's backward on CUDA
        assert call.fetched is not None
        tensor = call.fetched.get(index)
        if tensor is None:  # unpacked once more than packed (a retained graph): fetch it again
            tensor = call.host[index].to(call.devices[index])
        if call.ready is not None:
            current = torch.cuda.current_stream(tensor.device)
            current.wait_event(call.ready)
            tensor.record_stream(current)
        call.users[index] -= 1
        if call.users[index] <= 0:
            call.fetched.pop(index, None)  # dropped from the device once its last user has it
        return tensor


class OffloadedBlock(ActivationWrapper):
    """A decoder block whose saved activations go to host memory (names as torch's activation wrappers: the prefix
    ``_checkpoint_wrapped_module.`` that ``activation_checkpoint.hf_name`` removes)."""

    def __init__(self, block: nn.Module, offloader: ActivationOffloader) -> None:
        super().__init__(block)
        self.offloader = offloader

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.offloader.offloading(self._checkpoint_wrapped_module):
            return self._checkpoint_wrapped_module(*args, **kwargs)


def _wrap_blocks(built: BuiltModel, ctx: BuildContext) -> None:
    host = torch.device("meta" if ctx.options.fake_mode is not None else "cpu")
    offloader = ActivationOffloader(host)
    for part in range(len(built.parts)):
        for index, block in enumerate(built.blocks(part)):
            built.replace_block(part, index, OffloadedBlock(block, offloader))


TRANSFORM = Transform(
    name="activation_offload",
    wanted=lambda options: options.plan.offload_activations,
    apply=_wrap_blocks,
    rename=hf_name,
    planner_terms=("memory_terms.micro_batch_activations", "cost.activation_offload_seconds"),
)
