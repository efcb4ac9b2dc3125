"""AIMD admission (gpu_worker/admission.py): the limit's arithmetic on a controlled clock, and the slots it gives."""

from __future__ import annotations

import asyncio

import pytest

from gpu_worker.admission import Admission, AdmissionPolicy, Outcome
from nightbatch.settings import AdmissionSettings


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def admission(**policy: object) -> tuple[Admission, Clock]:
    clock = Clock()
    values = {"floor": 2, "ceiling": 16, "initial": 8, "decrease": 0.5, "increase": 1.0, **policy}
    return Admission(AdmissionPolicy(**values), clock=clock), clock  # type: ignore[arg-type]


def test_overload_halves_down_to_the_floor_and_no_further() -> None:
    a, clock = admission()
    for expected in (4, 2, 2, 2):
        clock.t += 1
        a.release(clock.t, Outcome.OVERLOAD)
        assert a.limit == expected
    assert a.stats.decreases == 2 and a.stats.lowest == 2


def test_answers_to_requests_sent_before_a_decrease_do_not_decrease_it_again() -> None:
    a, clock = admission()
    sent = [clock.t] * 5  # one round of requests, all sent at the old limit
    clock.t += 1
    for at in sent:
        a.release(at, Outcome.OVERLOAD)
    assert a.limit == 4 and a.stats.overloads == 5 and a.stats.decreases == 1
    clock.t += 1
    a.release(clock.t, Outcome.OVERLOAD)  # sent after it: a new congestion event
    assert a.limit == 2


def test_additive_increase_after_a_window_of_successes_up_to_the_ceiling() -> None:
    a, clock = admission(initial=4, ceiling=6)
    for _ in range(3):
        a.release(clock.t, Outcome.SUCCESS)
    assert a.limit == 4  # not yet a whole window
    a.release(clock.t, Outcome.SUCCESS)
    assert a.limit == 5
    for _ in range(50):
        a.release(clock.t, Outcome.SUCCESS)
    assert a.limit == 6 and a.stats.highest == 6


def test_neutral_outcome_frees_the_slot_and_leaves_the_limit() -> None:
    a, clock = admission()
    a.release(clock.t, Outcome.NEUTRAL)
    assert a.limit == 8 and a.stats.decreases == 0 and a.stats.increases == 0


def test_saturation_decreases_per_reading_and_holds_growth_until_it_clears() -> None:
    a, clock = admission(initial=8)
    a.report_saturation(True)
    a.report_saturation(True)
    assert a.limit == 2 and a.stats.saturated_reads == 2
    for _ in range(10):
        a.release(clock.t, Outcome.SUCCESS)
    assert a.limit == 2  # no growth while saturated
    a.report_saturation(False)
    for _ in range(2):
        a.release(clock.t, Outcome.SUCCESS)
    assert a.limit == 3


def test_policy_from_settings_clamps_and_takes_the_endpoint_ceiling() -> None:
    settings = AdmissionSettings(floor=4, ceiling=64, initial=100)
    assert AdmissionPolicy.from_settings(settings) == AdmissionPolicy(floor=4, ceiling=64, initial=64)
    small = AdmissionPolicy.from_settings(settings, ceiling=3)
    assert (small.floor, small.ceiling, small.initial) == (3, 3, 3)
    with pytest.raises(ValueError):
        AdmissionPolicy(floor=5, ceiling=4)


def test_acquire_waits_for_a_free_slot_and_a_release_lets_the_next_go() -> None:
    async def scenario() -> None:
        a, _clock = admission(floor=2, initial=2)
        first = await a.acquire()
        await a.acquire()
        third = asyncio.create_task(a.acquire())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not third.done() and a.in_flight == 2
        a.release(first, Outcome.SUCCESS)
        await asyncio.wait_for(third, timeout=10)
        assert a.in_flight == 2

    asyncio.run(scenario())


def test_retry_after_holds_new_requests_until_it_has_passed() -> None:
    async def scenario() -> None:
        a, clock = admission()
        sent = await a.acquire()
        a.release(sent, Outcome.OVERLOAD, retry_after=60)
        assert a.held_for == 60
        waiting = asyncio.create_task(a.acquire())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done() and a.in_flight == 0  # slots are free, but the server said wait
        clock.t += 61  # the hold has passed: the next event lets it go
        other = await a.acquire()
        a.release(other, Outcome.SUCCESS)
        await asyncio.wait_for(waiting, timeout=10)

    asyncio.run(scenario())


def test_a_cancelled_waiter_that_was_woken_passes_its_slot_on() -> None:
    async def scenario() -> None:
        a, _clock = admission(floor=1, initial=1)
        sent = await a.acquire()
        first = asyncio.create_task(a.acquire())
        second = asyncio.create_task(a.acquire())
        for _ in range(3):
            await asyncio.sleep(0)
        a.release(sent, Outcome.SUCCESS)  # wakes `first`...
        first.cancel()  # ...which is cancelled before it runs
        await asyncio.wait_for(second, timeout=10)
        assert a.in_flight == 1

    asyncio.run(scenario())
