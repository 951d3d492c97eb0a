"""How the transformers backend draws each next id, apart from the global RNG.

`stream_uniforms` gives each row's uniform for its n-th token from a
counter-based hash (SplitMix64) of (stream, n), so a row's draws do not depend
on the rows around it; `sample_ids` turns a row's logits into an id at that
uniform (temperature, top-p, then `_draw`'s inversion of the cumulative
distribution), or the argmax at temperature 0, with the id's logprob under the
distribution it was drawn from. `agentgym.policy.hf` samples with these.
"""

from __future__ import annotations

import numpy as np
import torch

from agentgym.policy.base import SamplingParams

_GOLDEN, _MIX1, _MIX2 = (
    np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
)


def stream_uniforms(streams: np.ndarray, index: int | np.ndarray) -> torch.Tensor:
    """The `index`-th uniform in [0, 1) of each stream (uint64 array; `index` one for all,
    or one per stream, as continuous batching draws them): SplitMix64 of
    stream + (index + 1) * golden ratio, the top 53 bits. Stateless, so each row's
    draws depend only on its stream, never on the batch around it."""
    with np.errstate(over="ignore"):
        z = streams + np.uint64(index + 1) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One id per row, by inverting the cumulative distribution at the row's uniform `u`.

    Equivalent to `torch.multinomial(probs, 1)`, whose CPU kernel draws an
    exponential per vocabulary entry and took about a tenth of a decode step.
    An id of probability 0 is never drawn: its cumulative value equals its
    predecessor's, and the search returns the first entry exceeding the draw.
    """
    cdf = probs.cumsum(-1)
    point = u.to(device=probs.device, dtype=cdf.dtype)[:, None] * cdf[:, -1:]
    ids = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    return ids.clamp(max=probs.shape[-1] - 1)


def sample_ids(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None):
    """Draws one id per row at its uniform `u` [B]; returns (ids [B], logprob of each
    under logits / T).

    Temperature 0 is greedy decoding (`u` unused): the argmax, with its logprob
    under the logits.
    """
    if params.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        ids = logprobs.argmax(dim=-1)
        return ids, logprobs.gather(-1, ids[:, None]).squeeze(-1)
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # keeps the top token always
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    assert u is not None  # the caller draws uniforms whenever the temperature is not 0
    ids = _draw(probs, u)
    return ids, logprobs.gather(-1, ids[:, None]).squeeze(-1)
