"""Forward hooks on the real decoder layers that record what each sublayer does to the residual stream.

Hooks are global state on a shared model, so they only exist inside `recording(...)`, which removes
them in `finally`. Values stay on the device until one transfer at the end of the step.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch
import torch.nn.functional as F

from d3.adapter import Adapter
from d3.trace import LAYER_STATS

N_STATS = len(LAYER_STATS)  # attn_cos, attn_dist, mlp_cos, mlp_dist, hidden_norm


def _change(before: torch.Tensor, after: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over positions of cosine(before, after) and ||after - before|| / ||before||: two [batch] tensors."""
    b, a = before.float(), after.float()  # [batch, pos, d_model]
    cos = F.cosine_similarity(b, a, dim=-1)  # [batch, pos]
    dist = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)
    return _mean(cos, valid), _mean(dist, valid)


def _mean(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    if valid is None or values.shape[1] == 1:
        return values.mean(dim=1)
    w = valid[:, -values.shape[1]:].to(values.dtype)
    return (values * w).sum(1) / w.sum(1).clamp_min(1)


class StatsRecorder:
    """Collects per-layer sublayer change for one forward pass (a prefill or one decode step).

    For a one-token decode step the hooks only keep references to each layer's input, middle and
    output states; `collect` stacks them and computes every layer's statistics in a few vectorised
    kernels, so tracing adds almost nothing per layer. A prefill (many positions) is reduced layer by
    layer instead, so it never holds [layers, prompt, d_model] at once.

    stats: float32 [N_STATS, batch, num_layers], NaN where a layer did not run.
    inputs: layer -> its input hidden state, kept only for layers in `keep_inputs` (attention capture).
    """

    def __init__(self, num_layers: int, keep_inputs: tuple[int, ...] = ()) -> None:
        self.num_layers = num_layers
        self.keep_inputs = set(keep_inputs)
        self.valid: torch.Tensor | None = None  # [batch, pos] 1 for real tokens (prefill padding excluded)
        self.stats: torch.Tensor | None = None
        self.inputs: dict[int, torch.Tensor] = {}
        self._deferred: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._h_in: torch.Tensor | None = None
        self._h_mid: torch.Tensor | None = None

    def begin(self, batch: int, device: torch.device, valid: torch.Tensor | None = None) -> None:
        self.stats = torch.full((N_STATS, batch, self.num_layers), float("nan"), device=device)
        self.valid = valid
        self.inputs = {}
        self._deferred = []

    def on_layer_in(self, idx: int, module: torch.nn.Module, args: tuple) -> None:
        self._h_in = args[0]
        if idx in self.keep_inputs:
            self.inputs[idx] = args[0]

    def on_mid(self, idx: int, module: torch.nn.Module, args: tuple) -> None:
        self._h_mid = args[0]

    def on_layer_out(self, idx: int, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        if self.stats is None or self._h_in is None or self._h_mid is None:
            return
        h_out = output[0] if isinstance(output, tuple) else output
        if h_out.shape[1] == 1:
            self._deferred.append((idx, self._h_in, self._h_mid, h_out))
        else:
            s = self.stats
            s[0, :, idx], s[1, :, idx] = _change(self._h_in, self._h_mid, self.valid)
            s[2, :, idx], s[3, :, idx] = _change(self._h_mid, h_out, self.valid)
            s[4, :, idx] = _mean(h_out.float().norm(dim=-1), self.valid)
        self._h_in = self._h_mid = None

    def _reduce_deferred(self) -> None:
        """All one-token layers at once: [layers, batch, d_model] stacks, a handful of kernels."""
        idxs = [d[0] for d in self._deferred]
        h_in, h_mid, h_out = (torch.stack([d[k][:, -1] for d in self._deferred]).float() for k in (1, 2, 3))
        s = self.stats
        for k, (before, after) in enumerate(((h_in, h_mid), (h_mid, h_out))):
            s[2 * k][:, idxs] = F.cosine_similarity(before, after, dim=-1).T  # [batch, layers]
            s[2 * k + 1][:, idxs] = ((after - before).norm(dim=-1) / before.norm(dim=-1).clamp_min(1e-6)).T
        s[4][:, idxs] = h_out.norm(dim=-1).T
        self._deferred = []

    def collect(self) -> torch.Tensor:
        """float32 CPU [N_STATS, batch, num_layers]; one device transfer per step."""
        assert self.stats is not None
        if self._deferred:
            self._reduce_deferred()
        return self.stats.detach().cpu()


@contextmanager
def recording(adapter: Adapter, recorder: StatsRecorder) -> Iterator[StatsRecorder]:
    """Register the recorder's hooks on every decoder layer; always remove them on exit."""
    handles = []
    try:
        for idx, layer in enumerate(adapter.layers):
            handles.append(layer.register_forward_pre_hook(partial(recorder.on_layer_in, idx)))
            handles.append(adapter.mid_norm(idx).register_forward_pre_hook(partial(recorder.on_mid, idx)))
            handles.append(layer.register_forward_hook(partial(recorder.on_layer_out, idx)))
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


def count_hooks(module: torch.nn.Module) -> int:
    """Number of forward (pre-)hooks registered anywhere under `module` (0 after every call)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())
