"""The identity-keyed cache behind ``space_of`` and the partial-recompute terms
(planner/model/memo.py): a hit only for the same objects, the least recently used dropped
first, and the keyed objects held so that their ids cannot be reused while cached."""

from __future__ import annotations

import gc
import weakref

from planner.model.memo import IdentityCache


class Obj:
    pass


def test_the_same_objects_hit_and_equal_ones_do_not():
    cache, made = IdentityCache(4), []

    def make(tag):
        return lambda: made.append(tag) or tag

    a, b = Obj(), Obj()
    assert cache.get((a,), "k", make("first")) == "first"
    assert cache.get((a,), "k", make("again")) == "first"
    assert cache.get((a,), "other key", make("keyed")) == "keyed"
    assert cache.get((b,), "k", make("b")) == "b"
    assert made == ["first", "keyed", "b"]


def test_the_least_recently_used_entry_goes_first():
    cache = IdentityCache(2)
    a, b, c = Obj(), Obj(), Obj()
    cache.get((a,), None, lambda: "a")
    cache.get((b,), None, lambda: "b")
    cache.get((a,), None, lambda: "a again")          # a is now the most recently used
    cache.get((c,), None, lambda: "c")                # so b is dropped, not a
    assert len(cache) == 2
    assert cache.get((a,), None, lambda: "a made anew") == "a"
    assert cache.get((b,), None, lambda: "b made anew") == "b made anew"


def test_an_entry_keeps_its_objects_alive_until_it_is_dropped():
    cache = IdentityCache(1)
    a = Obj()
    ref = weakref.ref(a)
    cache.get((a,), None, lambda: 1)
    del a
    gc.collect()
    assert ref() is not None          # held: no new object can take its id while cached
    cache.get((Obj(),), None, lambda: 2)                  # a's entry is dropped
    gc.collect()
    assert ref() is None
    cache.clear()
    assert len(cache) == 0
