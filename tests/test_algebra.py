"""The algebra raises on what the MIP encodings cannot represent exactly, instead of dropping it
(planner/model/algebra.py lists what is supported)."""

from __future__ import annotations

import pytest

from formulations.encoding import encode
from formulations.space import build_space
from planner.model import terms
from planner.model.algebra import Sig, Unencodable, gt1, ring_share, vmax
from planner.model.instance import parse_instance

t, p = Sig.var("t"), Sig.var("p")


@pytest.mark.parametrize("build", [
    lambda: 1 / (t + p),                      # division by a sum
    lambda: t / gt1(p),                       # division by a function factor
    lambda: ring_share(t + p),                # a function of a sum
    lambda: vmax(t, p) * vmax(t, 1),          # a product of two maxima
    lambda: -vmax(t, p),                      # a negated maximum
    lambda: vmax(t, p) * (t - 2),             # a maximum scaled by a possibly negative factor
    lambda: vmax(vmax(t, p), 1),              # nested maxima
    lambda: t ** 0.5,                         # a non-integer power
    lambda: bool(t > 1),                      # a comparison of symbols
    lambda: float(t),
    lambda: 1 if t else 0,                    # a truth test
])
def test_unencodable_constructs_raise(build):
    with pytest.raises(Unencodable):
        build()


def test_supported_constructs_evaluate_exactly():
    x = 2 * (t - 1) / t + vmax(t * p, 3 * p) * gt1(p) + ring_share(t * p) ** 2
    assert x.evaluate({"t": 8, "p": 2}) == pytest.approx(2 * 7 / 8 + max(16, 6) * 1 + (15 / 16) ** 2)


def test_a_maximum_in_memory_is_refused_by_the_encoding(monkeypatch):
    """A memory term with a vmax used to vanish from the MIPs (the enumerator kept it); the
    encoding now refuses it, naming the constraint."""
    inst = parse_instance({"model": {"preset": "gpt-1.3b"}, "training": {"global_batch": 16},
                           "cluster": {"gpu": "a100-80gb", "nodes": 1}})
    real = terms.step_terms

    def with_max(inst_, x, k):
        out = real(inst_, x, k)
        out.memory["first"]["activations"] = vmax(out.memory["first"]["activations"], 1.0)
        return out

    monkeypatch.setattr("formulations.encoding.step_terms", with_max)
    with pytest.raises(Unencodable, match="memory of the first pipeline stage"):
        encode(build_space(inst))
