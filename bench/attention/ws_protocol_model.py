#!/usr/bin/env python3
"""A model of the synchronization of kernels/cuda/flash_backward_sm90_ws.cu, run in random interleavings.

Not a benchmark: the warp-specialized backward was written without a GPU, so its protocol is checked
here by simulation. Actors: the producer (fills a ring of STAGES stages: waits on "empty", publishes
the item, arrives on "full"; the end is item -1) and the two consumer warpgroups (per item: wait on
"full"; write their half of the dS^T buffer item % 2; bar.arrive on their own named barrier
BAR_DS + 2 c + item % 2; bar.sync on the other's; read both halves in the dQ product; arrive on
"empty" once dV/dK completed; finish reading when dQ completed). mbarriers complete a phase after
their count of arrivals; a named barrier of 256 threads is modelled as 2 warpgroup arrivals per
generation. Checks: every run ends (no deadlock), every barrier generation joins one item's arrive
and sync from both consumers, no dS^T buffer is written while the other consumer still reads it for
another item. --broken parity|buffer runs the variants without the id parity or the double buffer,
which must fail.

    python3 bench/attention/ws_protocol_model.py [--runs 3000] [--broken parity|buffer]
"""
import argparse
import random
import sys

STAGES = 2


class MBarrier:
    def __init__(self, count):
        self.count, self.left, self.phases = count, count, 0

    def arrive(self):
        self.left -= 1
        assert self.left >= 0, "more arrivals than the barrier's count"
        if self.left == 0:
            self.phases += 1
            self.left = self.count

    def done(self, parity):  # mbarrier.try_wait.parity: the phase of this parity has completed
        return (self.phases & 1) != parity


class NamedBarrier:  # bar.arrive / bar.sync of 2 warpgroups
    def __init__(self):
        self.members, self.generation = [], 0

    def add(self, who, item):
        self.members.append((who, item))
        if len(self.members) == 2:
            assert len({i for _, i in self.members}) == 1, f"a generation joins items {self.members}"
            assert len({w for w, _ in self.members}) == 2, f"one consumer arrived twice: {self.members}"
            self.members = []
            self.generation += 1


def run(n_items, seed, broken):
    rnd = random.Random(seed)
    full = [MBarrier(1) for _ in range(STAGES)]
    empty = [MBarrier(2) for _ in range(STAGES)]
    published = [None] * STAGES
    bars = {(c, par): NamedBarrier() for c in (0, 1) for par in (0, 1)}
    reading = {0: None, 1: None}  # (buffer, item) a consumer's dQ product reads

    def producer():
        it = 0
        while True:
            st = it % STAGES
            while not empty[st].done(((it // STAGES) & 1) ^ 1):
                yield
            published[st] = it if it < n_items else -1
            yield
            full[st].arrive()
            if it >= n_items:
                return
            it += 1
            yield

    def consumer(c):
        it = 0
        while True:
            st = it % STAGES
            while not full[st].done((it // STAGES) & 1):
                yield
            item = published[st]
            if item < 0:
                return
            assert item == it
            buf = 0 if broken == "buffer" else it & 1
            par = 0 if broken == "parity" else it & 1
            for other in (0, 1):
                r = reading[other]
                assert r is None or r[0] != buf or r[1] == it, \
                    f"consumer {c} writes dS^T buffer {buf} for item {it} while {other} reads it for item {r[1]}"
            yield
            bars[(c, par)].add(c, it)  # bar.arrive: no wait
            yield
            other_bar = bars[(1 - c, par)]
            generation = other_bar.generation
            other_bar.add(c, it)  # bar.sync: wait until the generation completes
            while other_bar.generation == generation:
                yield
            reading[c] = (buf, it)
            yield
            empty[st].arrive()  # wgmma_wait<1>: dV, dK done; dQ may still read
            yield
            reading[c] = None  # wgmma_wait<0>
            yield
            it += 1

    alive = [producer(), consumer(0), consumer(1)]
    steps = 0
    while alive:
        actor = rnd.choice(alive)
        try:
            next(actor)
        except StopIteration:
            alive.remove(actor)
        steps += 1
        if steps > 1_000_000:
            raise AssertionError(f"no end after {steps} steps (deadlock?), {n_items} items, seed {seed}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--broken", choices=("parity", "buffer"))
    args = parser.parse_args()
    if args.runs <= 0:
        parser.error("--runs must be positive")
    for seed in range(args.runs):
        try:
            run(random.Random(seed).randint(0, 12), seed, args.broken)
        except AssertionError as e:
            print(f"FAIL (run {seed}): {e}")
            return 1
    print(f"ok: {args.runs} random interleavings: no deadlock, every barrier generation joins one item, "
          "no dS^T buffer written while read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
