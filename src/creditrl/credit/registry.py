"""The estimator registry: every advantage estimator has one signature and is reached by name.

An estimator maps per-token rewards to per-token advantages and returns::

    fn(rewards, reward_mask, response_mask, *, group_ids=None, values=None, gamma=1.0, lam=1.0)
        -> (advantages, returns)

with B responses and T padded response positions:

- ``rewards``: float (B, T), the reward placed on each token (0 elsewhere);
- ``reward_mask``: bool (B, T), 1 where a reward was placed (a placed reward may be 0.0);
- ``response_mask``: bool (B, T), 1 on the tokens that are trained on (may have holes inside a
  response for observation/tool tokens, and trailing padding);
- ``group_ids``: long (B,), responses to the same prompt share an id (any values, any order);
- ``values``: float (B, T), V(s_t), the value of the state before token t is emitted;
- ``gamma``: the discount, a float in [0, 1];
- ``lam``: the GAE lambda, a float in [0, 1] or one per response (a float (B,) tensor, e.g. VAPO's
  length-adaptive lambda, :func:`creditrl.credit.lambdas.length_adaptive_lam`); estimators that do
  not bootstrap on values ignore it;
- ``advantages``, ``returns``: float (B, T), exactly 0 where ``response_mask`` is 0.

Because the signature is shared, a trainer never special-cases an estimator (verl's trainer has to,
since its registered functions take different arguments). ``estimate`` is the checked entry point:
it validates every input once; the estimators themselves trust their inputs.
"""

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

import torch
from torch import Tensor

OPTIONAL_INPUTS: frozenset[str] = frozenset({"group_ids", "values"})


class EstimatorFn(Protocol):
    """The one estimator signature (see the module docstring for shapes and dtypes)."""

    def __call__(
        self,
        rewards: Tensor,
        reward_mask: Tensor,
        response_mask: Tensor,
        *,
        group_ids: Tensor | None = None,
        values: Tensor | None = None,
        gamma: float = 1.0,
        lam: float | Tensor = 1.0,
    ) -> tuple[Tensor, Tensor]: ...


V = TypeVar("V")

ESTIMATORS: dict[str, EstimatorFn] = {}
_NEEDS: dict[str, frozenset[str]] = {}


def lookup(table: dict[str, V], kind: str, name: str) -> V:
    """Return ``table[name]``; an unknown name raises ValueError listing the valid names, sorted."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(table))}")
    return table[name]


def register_estimator(name: str, *, needs: Iterable[str] = ()) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register an estimator under ``name``; ``needs`` lists the optional inputs it cannot do
    without (a subset of ``{"group_ids", "values"}``). A name may be registered only once."""
    needed = frozenset(needs)
    if not needed <= OPTIONAL_INPUTS:
        raise ValueError(
            f"estimator {name!r}: needs must be a subset of {sorted(OPTIONAL_INPUTS)}; got {sorted(needed)}"
        )

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS:
            raise ValueError(f"estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        _NEEDS[name] = needed
        return fn

    return decorator


def requires(name: str) -> set[str]:
    """The optional inputs (``"group_ids"``, ``"values"``) that estimator ``name`` needs, so a
    trainer can check a configuration before it samples anything."""
    lookup(ESTIMATORS, "estimator", name)
    return set(_NEEDS[name])


def missing_input_error(estimator: str, input_name: str) -> ValueError:
    """The error an estimator raises when an input it needs was not given."""
    expected = "long tensor of shape (B,)" if input_name == "group_ids" else "float (B, T) tensor"
    return ValueError(f"estimator {estimator!r} needs {input_name} (a {expected}); got None")


def _describe(x: Tensor) -> str:
    return f"dtype {x.dtype}, shape {tuple(x.shape)}"


def require_tensor(name: str, x: object) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    return x


def check_float(name: str, x: object, shape: tuple[int, ...] | None = None) -> None:
    """Check that ``x`` is a floating-point (B, T) tensor, of exactly ``shape`` when given."""
    x = require_tensor(name, x)
    expected = "(B, T)" if shape is None else f"(B, T) = {shape}"
    bad_shape = x.dim() != 2 if shape is None else tuple(x.shape) != shape
    if not x.is_floating_point() or bad_shape:
        raise ValueError(f"{name} must be a floating-point tensor of shape {expected}; got {_describe(x)}")


def check_mask(name: str, x: object, shape: tuple[int, ...]) -> None:
    """Check that ``x`` is a bool tensor of exactly ``shape``. 0/1 integer or float masks are
    refused rather than converted, so a float tensor passed by mistake cannot pass as a mask."""
    x = require_tensor(name, x)
    if x.dtype != torch.bool or tuple(x.shape) != shape:
        raise ValueError(
            f"{name} must be a bool tensor of shape (B, T) = {shape}; got {_describe(x)} "
            "(masks are not converted: pass mask.bool())"
        )


def check_group_ids(x: object, batch: int) -> None:
    """Check that ``x`` is a long (torch.int64) tensor of shape (batch,)."""
    x = require_tensor("group_ids", x)
    if x.dtype != torch.long or tuple(x.shape) != (batch,):
        raise ValueError(
            f"group_ids must be a long (torch.int64) tensor of shape (B,) = ({batch},); got {_describe(x)}"
        )


def check_inputs(
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> None:
    """Check the shared estimator inputs (shapes and dtypes as in the module docstring): ranks,
    shapes, dtypes, a single device, and gamma and lam (each entry of a per-response lam) in [0, 1]."""
    check_float("rewards", rewards)
    shape = tuple(rewards.shape)
    check_mask("reward_mask", reward_mask, shape)
    check_mask("response_mask", response_mask, shape)
    tensors = [rewards, reward_mask, response_mask]
    if values is not None:
        check_float("values", values, shape)
        tensors.append(values)
    if group_ids is not None:
        check_group_ids(group_ids, shape[0])
        tensors.append(group_ids)
    if isinstance(lam, Tensor):
        check_row_lam(lam, shape[0])
        tensors.append(lam)
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"all inputs must be on one device; got {sorted(str(d) for d in devices)}")
    for label, x in (("gamma", gamma), ("lam", lam)):
        if not isinstance(x, Tensor) and not 0.0 <= x <= 1.0:
            raise ValueError(f"{label} must lie in [0, 1]; got {x}")


def check_row_lam(lam: Tensor, batch: int) -> None:
    """Check a per-response lambda: a floating-point tensor of shape (B,) = (batch,), every entry in [0, 1]."""
    if not lam.is_floating_point() or tuple(lam.shape) != (batch,):
        raise ValueError(
            f"a per-response lam must be a floating-point tensor of shape (B,) = ({batch},); got {_describe(lam)}"
        )
    if lam.numel() and not bool(((lam >= 0) & (lam <= 1)).all()):
        raise ValueError(f"lam must lie in [0, 1]; got entries from {float(lam.min())} to {float(lam.max())}")


def estimate(
    name: str,
    rewards: Tensor,
    reward_mask: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
) -> tuple[Tensor, Tensor]:
    """Run the estimator registered as ``name`` after checking every input once.

    Returns ``(advantages, returns)``, both float (B, T) in the dtype of ``rewards`` and exactly 0
    where ``response_mask`` is 0. Raises ValueError for an unknown name (listing the valid ones),
    a missing input the estimator needs, or a tensor of the wrong shape or dtype.
    """
    fn = lookup(ESTIMATORS, "estimator", name)
    options = {"group_ids": group_ids, "values": values, "gamma": gamma, "lam": lam}
    for needed in sorted(_NEEDS[name]):
        if options[needed] is None:
            raise missing_input_error(name, needed)
    check_inputs(rewards, reward_mask, response_mask, **options)
    return fn(rewards, reward_mask, response_mask, **options)
