"""Forward + backward time of the vision encoder, the projector (patch mergers) and the decoder.

Measured with hooks, so the model code is untouched and the cost stays in the noise
(scripts/bench_hooks.py prints hooks-on / hooks-off in one run):

Forward: module forward pre/post hooks give exact spans. The projector runs inside the vision
model's forward (the main merger after the last block, a deepstack merger after each
deepstack block), so vision encoder = vision model span - projector spans. Decoder = token
embedding + language model + lm_head.

Backward: autograd runs the nodes of one device roughly in reverse creation order, so the
backward of this model is a sequence of stretches, one component at a time: loss, decoder,
projector, vision blocks (a deepstack merger between two of them), token embedding. Hooks on
autograd nodes mark where each stretch starts; every interval is charged to the component
that started it:

    lm_head output node starts              -> decoder
    decoder input (inputs_embeds) producer  -> other (image-token scatter, splits)
    a merger's output node starts           -> projector
    a merger's input producer starts        -> vision_encoder
    patch-embedding conv node finished      -> other
    token-embedding node starts / finished  -> decoder / other

Anything not charged to a component (loss, glue, optimizer, data) is step time minus the sum.
Activation recompute runs inside the node that needs it, so it lands in its component. On GPU
the marks are CUDA events on the current stream (read after the step's synchronise), on CPU
perf_counter readings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

COMPONENTS = ("vision_encoder", "projector", "decoder")
OTHER = "other"
_END = "end"


class Clock:
    """perf_counter readings; subclasses record device events instead."""

    def mark(self) -> Any:
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start)


class CudaClock(Clock):
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0  # valid once the device is synchronised


def clock_for(device: torch.device) -> Clock:
    return CudaClock(device) if device.type == "cuda" else Clock()


@dataclass
class ComponentTimes:
    forward_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))
    backward_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0.0))

    @property
    def total_s(self) -> dict[str, float]:
        return {name: self.forward_s[name] + self.backward_s[name] for name in COMPONENTS}


@dataclass
class _Span:
    charges: tuple[tuple[str, float], ...]  # (component, +1 adds / -1 removes a nested span)
    start: Any = None
    end: Any = None


class ComponentTimer:
    """Hooks on a Qwen3VLMoeForConditionalGeneration; `enabled=False` installs nothing."""

    def __init__(self, model: nn.Module, clock: Clock, enabled: bool = True) -> None:
        self.clock = clock
        self.enabled = enabled
        self._handles: list[RemovableHandle] = []
        self._spans: list[_Span] = []
        self._marks: list[tuple[Any, str]] = []
        self._in_backward = False
        if enabled:
            self._attach(model)

    # --- the engine's calls around each micro-batch's backward and each step -------------

    def begin_backward(self) -> None:
        if self.enabled:
            self._in_backward = True
            self._marks.append((self.clock.mark(), OTHER))

    def end_backward(self) -> None:
        if self.enabled:
            self._marks.append((self.clock.mark(), _END))
            self._in_backward = False

    def collect(self) -> ComponentTimes:
        """Times since the last collect; call after the step's device synchronise."""
        times = ComponentTimes()
        for span in self._spans:
            seconds = self.clock.seconds(span.start, span.end)
            for component, sign in span.charges:
                times.forward_s[component] += sign * seconds
        for (start, component), (end, _) in zip(self._marks, self._marks[1:], strict=False):
            if component in COMPONENTS:
                times.backward_s[component] += self.clock.seconds(start, end)
        self._spans.clear()
        self._marks.clear()
        return times

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # --- hooks -------------------------------------------------------------------------

    def _attach(self, model: Any) -> None:
        # Qwen3VLMoeForConditionalGeneration; its submodules are reached by attribute.
        inner = model.model
        visual = inner.visual
        language = inner.language_model
        mergers = [visual.merger, *visual.deepstack_merger_list]

        self._time_forward(visual, ("vision_encoder", +1.0))
        for merger in mergers:
            self._time_forward(merger, ("vision_encoder", -1.0), ("projector", +1.0))
            self._on_output_node(merger, "projector")
            self._on_input_producer(merger, "vision_encoder")
        for module in (language.embed_tokens, language, model.lm_head):
            self._time_forward(module, ("decoder", +1.0))
        self._on_output_node(model.lm_head, "decoder")
        self._on_input_producer(language, OTHER, kwarg="inputs_embeds")
        self._on_output_node(language.embed_tokens, "decoder", after=OTHER)
        self._on_output_node(visual.patch_embed.proj, None, after=OTHER)

    def _mark(self, component: str) -> None:
        self._marks.append((self.clock.mark(), component))

    def _time_forward(self, module: nn.Module, *charges: tuple[str, float]) -> None:
        open_spans: list[_Span] = []  # a stack: a module may be re-entered

        def pre(_module: nn.Module, _args: Any) -> None:
            if not self._in_backward:  # recompute re-runs forwards inside backward
                open_spans.append(_Span(charges, start=self.clock.mark()))

        def post(_module: nn.Module, _args: Any, _output: Any) -> None:
            if not self._in_backward and open_spans:
                span = open_spans.pop()
                span.end = self.clock.mark()
                self._spans.append(span)

        self._handles.append(module.register_forward_pre_hook(pre))
        self._handles.append(module.register_forward_hook(post))

    def _on_output_node(self, module: nn.Module, component: str | None, after: str | None = None) -> None:
        """Mark `component` when the node that made the module's output starts in backward
        (and `after` once it has finished)."""

        def post(_module: nn.Module, _args: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            node = tensor.grad_fn if tensor is not None else None
            if self._in_backward or node is None:
                return
            if component is not None:
                node.register_prehook(_call_once(lambda _grads: self._mark(component)))
            if after is not None:
                node.register_hook(_call_once(lambda _inputs, _outputs: self._mark(after)))

        self._handles.append(module.register_forward_hook(post))

    def _on_input_producer(self, module: nn.Module, component: str, kwarg: str | None = None) -> None:
        """Mark `component` when the gradient of the module's input is complete, i.e. when the
        node that produced the input is about to run: the module's own backward is over."""

        def pre(_module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            tensor = kwargs.get(kwarg) if kwarg else _first_tensor(args)
            if self._in_backward or not isinstance(tensor, torch.Tensor) or tensor.grad_fn is None:
                return
            tensor.register_hook(_call_once(lambda _grad: self._mark(component)))

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    return None


def _call_once(hook: Callable[..., None]) -> Callable[..., None]:
    # A node can run twice only under retain_graph; count its first run.
    done = False

    def once(*args: Any) -> None:
        nonlocal done
        if not done:
            done = True
            hook(*args)

    return once
