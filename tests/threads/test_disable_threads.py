"""``ember.disable(recursive=True)`` is a property of the thread running the disabled function (as
torch's is: its eval-frame callback is per thread). A thread inside a disabled function must not make
compiled calls of other threads run eagerly, and disabled regions that overlap in time across threads
must not leave the process disabled when they end in another order than they began."""
import threading

import torch

import ember
from ember.testing import CompileCounter, cache_of


def test_a_disabled_region_in_one_thread_does_not_disable_another():
    inside, release = threading.Event(), threading.Event()

    @ember.disable
    def hold():
        inside.set()
        release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(30)
        counter = CompileCounter()
        cf = ember.compile(lambda x: x * 2 + 1, backend=counter)
        x = torch.randn(3)
        torch.testing.assert_close(cf(x), x * 2 + 1)
        assert counter.frame_count == 1 and cache_of(cf).compile_count == 1  # compiled, not run eagerly
    finally:
        release.set()
        t.join()


def test_disabled_inside_its_own_thread_still_runs_eagerly():
    counter = CompileCounter()
    cf = ember.compile(lambda x: x - 1, backend=counter)
    seen = []

    @ember.disable
    def outer(x):
        seen.append(cf(x))

    t = threading.Thread(target=outer, args=(torch.ones(2),))
    t.start()
    t.join()
    torch.testing.assert_close(seen[0], torch.zeros(2))
    assert counter.frame_count == 0


def test_overlapping_disabled_regions_ending_out_of_order_restore_compiling():
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    @ember.disable
    def region_a():  # enters first, leaves first
        a_in.set()
        assert b_in.wait(30)

    @ember.disable
    def region_b():  # enters second, leaves last
        b_in.set()
        assert a_out.wait(30)

    ta, tb = threading.Thread(target=region_a), threading.Thread(target=region_b)
    ta.start()
    assert a_in.wait(30)  # region_a is inside before region_b's wrapper starts
    tb.start()
    ta.join()
    a_out.set()
    tb.join()
    counter = CompileCounter()
    cf = ember.compile(lambda x: x + 3, backend=counter)
    cf(torch.zeros(2))
    assert counter.frame_count == 1  # before the fix the process stayed disabled: nothing compiled
