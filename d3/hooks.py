"""Named hook points on the real decoder layers, recording what each sublayer does to the residual stream.

Three points per layer, named as TransformerLens names them: `resid_pre` (the layer's input), `resid_mid`
(the residual stream after attention, read as the input of the post-attention norm) and `resid_post` (the
layer's output). Hooks are global state on a shared model, so they only exist inside `recording(...)`, which
removes them in `finally`. Values stay on the device until one transfer at the end of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, cast

import torch
import torch.nn.functional as F

from d3.adapter import Adapter
from d3.trace import LAYER_STATS


def _change(before: torch.Tensor, after: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over positions of cosine(before, after) and ||after - before|| / ||before||: two [batch] tensors."""
    b, a = before.float(), after.float()  # [batch, pos, d_model]
    cos = F.cosine_similarity(b, a, dim=-1)  # [batch, pos]
    dist = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)
    return _mean(cos, valid), _mean(dist, valid)


def _mean(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    if valid is None or values.shape[1] == 1:
        return values.mean(dim=1)
    w = valid[:, -values.shape[1]:].to(values.device, values.dtype)  # the mask lives with the inputs, not the layer
    return (values * w).sum(1) / w.sum(1).clamp_min(1)


HOOK_POINTS = ("resid_pre", "resid_mid", "resid_post")


def hook_points(adapter: Adapter, idx: int) -> dict[str, tuple[torch.nn.Module, bool]]:
    """Where layer `idx`'s named points are read: point -> (module, True if from its output else its input)."""
    layer = adapter.layers[idx]
    return {"resid_pre": (layer, False), "resid_mid": (adapter.mid_norm(idx), False), "resid_post": (layer, True)}


class StatsRecorder:
    """Collects per-layer sublayer change (LAYER_STATS, by name) for one forward pass: a prefill or one decode step.

    For a one-token decode step it only keeps references to each layer's resid_pre / resid_mid / resid_post;
    `collect` stacks them and computes every layer's statistics in a few vectorised kernels, so tracing adds
    almost nothing per layer. A prefill (many positions) is reduced layer by layer instead, so it never holds
    [layers, prompt, d_model] at once.

    stats: LAYER_STATS name -> float32 [batch, num_layers], NaN where a layer did not run.
    inputs: layer -> its resid_pre, kept only for layers in `keep_inputs` (attention capture).
    """

    def __init__(self, num_layers: int, keep_inputs: tuple[int, ...] = ()) -> None:
        self.num_layers = num_layers
        self.keep_inputs = set(keep_inputs)
        self.valid: torch.Tensor | None = None  # [batch, pos] 1 for real tokens (prefill padding excluded)
        self.stats: dict[str, torch.Tensor] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self._deferred: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._seen: dict[str, torch.Tensor] = {}  # resid_pre / resid_mid of the layer running now

    def begin(self, batch: int, device: torch.device, valid: torch.Tensor | None = None) -> None:
        # float32 whatever torch's default dtype is now: a model loading in another thread (transformers sets the
        # process-wide default to bfloat16 while it builds one) must not change what this run records into.
        self.stats = {name: torch.full((batch, self.num_layers), float("nan"), dtype=torch.float32, device=device)
                      for name in LAYER_STATS}
        self.valid = valid
        self.inputs = {}
        self._deferred = []
        self._seen = {}

    def on(self, point: str, idx: int, hidden: torch.Tensor) -> None:
        """Hook point `point` of layer `idx` saw the residual stream `hidden` ([batch, pos, d_model])."""
        if point != "resid_post":
            self._seen[point] = hidden
            if point == "resid_pre" and idx in self.keep_inputs:
                self.inputs[idx] = hidden
            return
        h_in, h_mid = self._seen.pop("resid_pre", None), self._seen.pop("resid_mid", None)
        if not self.stats or h_in is None or h_mid is None:
            return
        if hidden.shape[1] == 1:
            self._deferred.append((idx, h_in, h_mid, hidden))
        else:
            self._reduce_layer(idx, h_in, h_mid, hidden)

    def _reduce_layer(self, idx: int, h_in: torch.Tensor, h_mid: torch.Tensor, h_out: torch.Tensor) -> None:
        """One layer of a prefill: means over the real (unpadded) positions."""
        s = self.stats  # on the model's first device; layer idx may live on another (device_map="auto")
        h_in = h_in.to(h_mid.device)  # the layer's input comes from the layer below, perhaps on another device
        s["attn_cos"][:, idx], s["attn_dist"][:, idx] = _change(h_in, h_mid, self.valid)
        s["mlp_cos"][:, idx], s["mlp_dist"][:, idx] = _change(h_mid, h_out, self.valid)
        s["hidden_norm"][:, idx] = _mean(h_out.float().norm(dim=-1), self.valid)

    def _reduce_deferred(self) -> None:
        """All one-token layers at once: [layers, batch, d_model] stacks, a handful of kernels."""
        idxs = [d[0] for d in self._deferred]
        s = self.stats
        device = next(iter(s.values())).device  # layers may live on several devices: one [batch, d_model] each moves
        h_in, h_mid, h_out = (torch.stack([cast(torch.Tensor, d[k])[:, -1].to(device) for d in self._deferred]).float()
                              for k in (1, 2, 3))
        for sublayer, before, after in (("attn", h_in, h_mid), ("mlp", h_mid, h_out)):
            s[f"{sublayer}_cos"][:, idxs] = F.cosine_similarity(before, after, dim=-1).T  # [batch, layers]
            s[f"{sublayer}_dist"][:, idxs] = ((after - before).norm(dim=-1) / before.norm(dim=-1).clamp_min(1e-6)).T
        s["hidden_norm"][:, idxs] = h_out.norm(dim=-1).T
        self._deferred = []

    def collect(self) -> dict[str, torch.Tensor]:
        """LAYER_STATS name -> float32 CPU [batch, num_layers]; one device transfer per step."""
        assert self.stats, "collect() before begin()"
        if self._deferred:
            self._reduce_deferred()
        values = torch.stack([self.stats[name] for name in LAYER_STATS]).detach().cpu()  # [N_STATS, batch, L]
        return dict(zip(LAYER_STATS, values.unbind(0)))


def _read_input(on: Callable[[str, int, torch.Tensor], None], point: str, idx: int, module: torch.nn.Module,
                args: tuple[Any, ...]) -> None:
    on(point, idx, args[0])


def _read_output(on: Callable[[str, int, torch.Tensor], None], point: str, idx: int, module: torch.nn.Module,
                 args: tuple[Any, ...], output: Any) -> None:
    on(point, idx, output[0] if isinstance(output, tuple) else output)


@contextmanager
def recording(adapter: Adapter, recorder: StatsRecorder, batch: int,
              valid: torch.Tensor | None = None) -> Iterator[StatsRecorder]:
    """Start `recorder` on a forward pass of `batch` sequences and register it on every layer's hook points;
    the hooks are always removed on exit. valid: [batch, pos] 1 for real tokens (a padded prefill)."""
    recorder.begin(batch, adapter.model.device, valid)
    handles = []
    try:
        for idx in range(adapter.num_layers):
            for point, (module, from_output) in hook_points(adapter, idx).items():
                if from_output:
                    handles.append(module.register_forward_hook(partial(_read_output, recorder.on, point, idx)))
                else:
                    handles.append(module.register_forward_pre_hook(partial(_read_input, recorder.on, point, idx)))
        yield recorder
    finally:
        for handle in handles:
            handle.remove()
