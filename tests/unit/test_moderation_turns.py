"""Whose check runs next in a Moderator (safety/moderator.py Turns): at most its workers at once, and a check
that holds something up (the last window of an answer, which holds the end of its stream) before the windows
waiting that hold nothing up. Under 64 streams this took the final check's wait from 7.1 s to 0.1 s
(bench/results/output_check_load.json)."""

import asyncio

from safety.moderator import Turns


async def test_urgent_checks_go_before_waiting_ones_and_no_more_than_the_slots_run():
    turns, order, running, most = Turns(2), [], [], [0]

    async def check(name: str, urgent: bool) -> None:
        async with turns.turn(urgent):
            running.append(name)
            most[0] = max(most[0], len(running))
            order.append(name)
            await asyncio.sleep(0.01)
            running.remove(name)

    tasks = [asyncio.create_task(check(f"window-{i}", False)) for i in range(6)]
    await asyncio.sleep(0)  # two run, four wait
    tasks += [asyncio.create_task(check(f"last-{i}", True)) for i in range(2)]
    await asyncio.gather(*tasks)
    assert order[:2] == ["window-0", "window-1"]
    assert order[2:4] == ["last-0", "last-1"]  # ahead of the four windows that were waiting before them
    assert order[4:] == ["window-2", "window-3", "window-4", "window-5"] and most[0] == 2
    assert turns.free == 2


async def test_a_check_cancelled_while_it_waits_gives_its_turn_on():
    turns = Turns(1)
    entered = []

    async def check(name: str) -> None:
        async with turns.turn(False):
            entered.append(name)
            await asyncio.sleep(0.01)

    first = asyncio.create_task(check("a"))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(check("b"))
    last = asyncio.create_task(check("c"))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(first, last, return_exceptions=True)
    assert entered == ["a", "c"] and turns.free == 1
