"""paddle's static graph: training through ``paddle.jit.to_static``, and exporting inference models.

Training: ``paddle_kwargs={"to_static": True, "input_spec": [InputSpec(...), ...]}``
converts the model's ``forward`` with ``paddle.jit.to_static`` when the driver is set
up. The ``input_spec`` entries map, in order, onto ``forward``'s parameters (paddle's
rule); their names must be those parameters' names, and every batch must supply
exactly the parameters the spec covers -- both are checked with a message instead of
paddle's traceback from inside the translated code. With ``full_graph=True`` (the
default here: the whole forward becomes one program, like Wenxin's static trainers)
the program is traced once at set-up, so a spec whose shapes do not fit the model
fails when the Trainer is built.

Export: :func:`export_inference_model` writes what ``paddle.jit.save`` writes (the
program and the parameters), which ``paddle.jit.load`` and ``paddle.inference``
(Paddle Inference, the serving runtime) load without the model's Python code.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import paddle
from paddle.static import InputSpec

from drivetrain.backend import DriverError, positional_parameters

try:  # the class paddle.jit.to_static puts in place of forward
    from paddle.jit.dy2static.program_translator import StaticFunction
except ImportError:  # pragma: no cover - moved in another paddle release
    StaticFunction = ()  # type: ignore[assignment,misc]

__all__ = ["export_inference_model"]


def check_input_spec(input_spec: Any, forward: Callable, owner: str, argument: str) -> list[str]:
    """Check ``input_spec`` against ``forward``'s signature; return the parameter names it covers, in order."""
    if isinstance(input_spec, InputSpec) or not isinstance(input_spec, Sequence) or isinstance(input_spec, str):
        raise DriverError(
            f"{argument}={input_spec!r:.120} must be a list of paddle.static.InputSpec, one per parameter of "
            f"{owner}.forward in order, e.g. [InputSpec([None, 784], 'float32', 'x')]."
        )
    if not input_spec:
        raise DriverError(f"{argument}=[] is empty; give one paddle.static.InputSpec per input of {owner}.forward.")
    for i, spec in enumerate(input_spec):
        if not isinstance(spec, InputSpec):
            raise DriverError(
                f"{argument}[{i}] is a {type(spec).__name__}, not a paddle.static.InputSpec; e.g. "
                "InputSpec(shape=[None, 784], dtype='float32', name='x')."
            )
    names, _, var_args, _ = positional_parameters(forward)
    signature = f"{owner}.forward({', '.join(names)}{', *args' if var_args else ''})"
    if len(input_spec) > len(names) and not var_args:
        raise DriverError(
            f"{argument} has {len(input_spec)} InputSpec(s) but {signature} takes {len(names)} input(s); "
            "give at most one InputSpec per parameter, in order."
        )
    covered = []
    for i, spec in enumerate(input_spec):
        expected = names[i] if i < len(names) else None
        if spec.name is not None and expected is not None and spec.name != expected:
            raise DriverError(
                f"{argument}[{i}] is named {spec.name!r} but parameter {i} of {signature} is {expected!r}; "
                "InputSpecs map onto forward's parameters in order, so name them after those parameters "
                f"(InputSpec(..., name={expected!r})) or reorder the list."
            )
        covered.append(expected if expected is not None else spec.name)
    return covered


def _source_missing(exc: BaseException) -> bool:
    """Whether tracing failed because Python cannot find forward's source code (paddle translates it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and "source code" in str(exc):  # inspect: "not available", "could not get"
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


_NO_SOURCE = ("paddle.jit translates the source code of {owner}.forward, and Python cannot find it (the class was "
              "defined in an interactive session or by exec); define the model in a .py file")


def _short(exc: BaseException) -> str:
    """The last meaningful line of paddle's (long, translated-code) error message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if not line.startswith(("[", "File ", "^", "~")):
            return f"{type(exc).__name__}: {line[:300]}"
    return type(exc).__name__


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence paddle's own false alarm while it builds a program's backward pass.

    paddle 3.3's ``full_like`` reads ``.place`` of a static value inside
    ``_append_backward`` and warns "Tensor do not have 'place' interface for pir graph
    mode" the first time each program is traced: nothing a user can act on.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tensor do not have 'place' interface for pir graph mode")
        yield


class StaticTraining:
    """The ``to_static`` conversion of one model for training, with its checks."""

    def __init__(self, model: paddle.nn.Layer, input_spec: Any, full_graph: bool) -> None:
        self.model = model
        self.forward = model.forward  # the dygraph forward: its signature drives parameter matching
        self.owner = type(model).__name__
        self.full_graph = full_graph
        self.input_spec = None
        self.covered: list[str] | None = None
        parameters = positional_parameters(self.forward)
        self.var_kw, self.forward_names = parameters.var_kw, frozenset(parameters.names)
        if input_spec is not None:
            if not full_graph:
                raise DriverError(
                    "paddle_kwargs['input_spec'] needs full_graph=True: with full_graph=False (paddle's SOT mode) "
                    "paddle ignores input_spec and traces the shapes it meets; drop one of the two."
                )
            self.covered = check_input_spec(input_spec, self.forward, self.owner, "paddle_kwargs['input_spec']")
            self.input_spec = list(input_spec)
        self._checked: set[frozenset] = set()

    def convert(self) -> None:
        """Convert ``forward`` in place; with a full graph and a spec, trace now so a bad spec fails early."""
        if isinstance(self.model.__dict__.get("forward"), StaticFunction):
            return  # already converted (by the user, or by an earlier setup)
        paddle.jit.to_static(self.model, input_spec=self.input_spec, full_graph=self.full_graph)
        if self.full_graph and self.input_spec is not None:
            try:
                with quiet():
                    self.model.forward.concrete_program  # noqa: B018 - the property traces the program
            except Exception as exc:
                self.model.forward.rollback()
                if _source_missing(exc):
                    raise DriverError(
                        "paddle_kwargs={'to_static': True}: " + _NO_SOURCE.format(owner=self.owner)
                        + ", or pass 'full_graph': False (paddle's SOT mode works from bytecode)."
                    ) from exc
                raise DriverError(
                    f"paddle_kwargs['input_spec']={self.input_spec} does not fit {self.owner}.forward: tracing it "
                    f"with these shapes and dtypes failed ({_short(exc)}). Give each InputSpec the shape (None "
                    "for the batch dimension) and dtype of that input."
                ) from exc

    def check_batch(self, batch: Mapping[str, Any]) -> None:
        """The batch's matched keys must be exactly the inputs the spec covers (checked once per key set)."""
        if self.covered is None or self.var_kw:
            return
        keys = frozenset(batch)
        if keys in self._checked:
            return
        passed = keys & self.forward_names
        missing = [name for name in self.covered if name not in passed]
        extra = sorted(passed - set(self.covered))
        problems = [text for found, text in ((missing, f"the batch has no {missing}"),
                                             (extra, f"the batch also fills {extra}, which input_spec does not cover"))
                    if found]
        if problems:
            raise DriverError(
                f"to_static with input_spec for {self.covered}: {' and '.join(problems)}. A static program "
                "takes exactly the inputs it was traced with: add an InputSpec for every forward parameter the "
                "batches fill, or use input_mapping to drop or rename batch keys."
            )
        self._checked.add(keys)


def _layer_of(model_or_trainer: Any) -> paddle.nn.Layer:
    if isinstance(model_or_trainer, paddle.nn.Layer):
        return model_or_trainer
    driver = getattr(model_or_trainer, "driver", None)
    if driver is not None:
        if getattr(driver, "name", None) != "paddle":
            raise DriverError(
                f"export_inference_model: the {type(model_or_trainer).__name__} uses driver "
                f"{getattr(driver, 'name', None)!r}; only a paddle model can be exported as a paddle inference model."
            )
        return driver.unwrap_model()
    raise DriverError(
        f"export_inference_model(model_or_trainer={model_or_trainer!r:.80}): pass a paddle.nn.Layer, or a "
        "Trainer/Evaluator that drives one with driver='paddle'."
    )


def export_inference_model(model_or_trainer: Any, path: str | os.PathLike, input_spec: Sequence[InputSpec]) -> str:
    """Save a paddle inference model of ``forward`` for ``input_spec``; return the path prefix.

    ``path`` is a prefix: ``out/model`` writes ``out/model.json`` (the program; older
    paddle releases write ``.pdmodel``) and ``out/model.pdiparams`` (the weights). The
    model is traced in eval mode (dropout off, batch-norm statistics frozen) and put back
    in the mode it was in. ``input_spec`` lists one ``paddle.static.InputSpec`` per
    forward parameter the inference model takes, in order (e.g. the features, not the
    label). Load the result with ``paddle.jit.load(path)`` or ``paddle.inference``.

    A forward that returns a dict exports its values as outputs in the order of their
    sorted keys (``{"loss", "pred"}`` -> loss, pred); with ``input_spec`` leaving out the
    label, a forward like ``if target is None: return {"pred": ...}`` exports one output.
    """
    layer = _layer_of(model_or_trainer)
    owner = type(layer).__name__
    prefix = os.fspath(path)
    if not isinstance(prefix, str) or not prefix or prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        raise DriverError(
            f"export_inference_model(path={path!r}): pass a file prefix such as 'export/model' (it writes "
            "export/model.json and export/model.pdiparams), not a folder."
        )
    static_forward = layer.__dict__.get("forward")
    converted = isinstance(static_forward, StaticFunction)
    forward = layer._original_funcs["forward"].__get__(layer) if converted else layer.forward
    check_input_spec(input_spec, forward, owner, "input_spec")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    was_training = layer.training
    if converted:
        static_forward.rollback()  # trace the plain forward for this spec, not the training program
    layer.eval()
    try:
        with warnings.catch_warnings():  # the order of dict outputs is documented above
            warnings.filterwarnings("ignore", message="Found 'dict' in given outputs")
            paddle.jit.save(layer, prefix, input_spec=list(input_spec))
    except DriverError:
        raise
    except Exception as exc:
        if _source_missing(exc):
            raise DriverError("export_inference_model: " + _NO_SOURCE.format(owner=owner) + ".") from exc
        raise DriverError(
            f"export_inference_model: input_spec={list(input_spec)} does not fit {owner}.forward; tracing it "
            f"failed ({_short(exc)}). Give each InputSpec the shape (None for the batch dimension) and dtype "
            "of that input, and only inputs forward can run without (e.g. not the label if it needs a loss)."
        ) from exc
    finally:
        if converted:
            layer.forward = static_forward
        layer.train() if was_training else layer.eval()
    return prefix
