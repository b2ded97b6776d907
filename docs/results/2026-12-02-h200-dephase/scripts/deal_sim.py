"""CPU model of the one-role-a-program mixed kernel's static deal (attention_mixed_roles_hopper.py) on M1 / M2:
each program runs its dealt items in order; a prefill item costs its keys at the prefill kernel's rate, a decode walk
its bytes at one SM's decode rate, and decodes share HBM when more SMs stream at once than it feeds. Prints the
launch's modelled time, the heaviest program against the mean, and the most SMs decoding at once.

    python docs/results/2026-12-02-h200-dephase/scripts/deal_sim.py
"""
from __future__ import annotations

PROGRAMS = 132
PREFILL_US_PER_KEY = 852.0 * PROGRAMS / (512 * 15424)  # M2's prefill kernel: 852 us, 512 tiles of ~15.4k keys
HBM_GBS = 4400.0
DECODE_SM_GBS = float(__import__("os").environ.get("DECODE_SM_GBS", 120.0))
"""One SM's rate on a decode walk: 120 GB/s was the plan (session 34); the kernel measured ~60 (out4/: two walks of
16.8 MB a program in 553-567 us), so DECODE_SM_GBS=60 models what ran."""
ITEM_US = 1.5  # a walk's start (Q load, first tiles' latency)


def cells():
    """(name, prefill tiles' keys [item per (kv head, head in group, tile)], decode walks' keys)."""
    m2 = [14336 + 128 * (t + 1) for t in range(16)]
    m1 = [128 * (t + 1) for t in range(16)]
    return [("M2", m2, [4096] * 64 * 8), ("M1", m1, [2048] * 128 * 8)]


def dealt(work, p):
    rounds = work // PROGRAMS
    last = p if rounds % 2 == 0 else PROGRAMS - 1 - p
    return rounds + (last < work % PROGRAMS)


def dealt_item(j, p):
    return j * PROGRAMS + (p if j % 2 == 0 else PROGRAMS - 1 - p)


def prefill_order(tile_keys, head_major):
    """Item index -> keys: KV head by KV head, heaviest tile first; within a KV head tile-major (a tile's 4 query
    heads side by side) or head-major (a query head's tiles one after another)."""
    tiles = sorted(tile_keys, reverse=True)
    per_kv = [k for _ in range(4) for k in tiles] if head_major else [k for k in tiles for _ in range(4)]
    return per_kv * 8


def programs(cell, head_major, dephase, continue_deal):
    _, tile_keys, decode_keys = cell
    prefill = prefill_order(tile_keys, head_major)
    out = []
    for p in range(PROGRAMS):
        np_ = dealt(len(prefill), p)
        if continue_deal:
            nd = dealt(len(prefill) + len(decode_keys), p) - np_
            dec = [decode_keys[dealt_item(np_ + j, p) - len(prefill)] for j in range(nd)]
        else:
            nd = dealt(len(decode_keys), p)
            dec = [decode_keys[dealt_item(j, p)] for j in range(nd)]
        pre = [prefill[dealt_item(j, p)] for j in range(np_)]
        items = []
        if dephase:
            start = p * (np_ + 1) // PROGRAMS
            items = [("p", k) for k in pre[:start]] + [("d", k) for k in dec] + [("p", k) for k in pre[start:]]
        else:
            for k in range(np_ + nd):
                before = k * nd // (np_ + nd)
                if (k + 1) * nd // (np_ + nd) > before:
                    items.append(("d", dec[before]))
                else:
                    items.append(("p", pre[k - before]))
        out.append(items)
    return out


def simulate(progs, dt=0.5):
    """Time-stepped: a decoding SM moves min(its rate, HBM / decoders) bytes a step."""
    state = [[0, 0.0] for _ in progs]  # item index, work left (us at full rate)
    def load(p):
        i = state[p][0]
        if i < len(progs[p]):
            kind, keys = progs[p][i]
            state[p][1] = ITEM_US + (keys * PREFILL_US_PER_KEY if kind == "p"
                                     else keys * 128 * 2 * 2 / DECODE_SM_GBS / 1e3)
    for p in range(len(progs)):
        load(p)
    t, peak, finish = 0.0, 0, [0.0] * len(progs)
    while any(s[0] < len(progs[p]) for p, s in enumerate(state)):
        decoding = [p for p, s in enumerate(state) if s[0] < len(progs[p]) and progs[p][s[0]][0] == "d"]
        peak = max(peak, len(decoding))
        share = min(1.0, HBM_GBS / DECODE_SM_GBS / max(1, len(decoding)))
        for p, s in enumerate(state):
            if s[0] >= len(progs[p]):
                continue
            s[1] -= dt * (share if progs[p][s[0]][0] == "d" else 1.0)
            while s[1] <= 0 and s[0] < len(progs[p]):
                s[0] += 1
                finish[p] = t + dt
                load(p)
        t += dt
    return t, peak


def main():
    for cell in cells():
        for head_major, dephase, cont in [(False, False, False), (True, False, False), (True, True, False),
                                          (True, True, True)]:
            progs = programs(cell, head_major, dephase, cont)
            busy = [sum((k * PREFILL_US_PER_KEY if kind == "p" else k * 128 * 4 / DECODE_SM_GBS / 1e3) + ITEM_US
                        for kind, k in items) for items in progs]
            t, peak = simulate(progs)
            print(f"{cell[0]} head_major={head_major:d} dephase={dephase:d} continue_deal={cont:d}: {t:7.1f} us, "
                  f"heaviest/mean {max(busy) / (sum(busy) / len(busy)):.3f}, most SMs decoding {peak}")


if __name__ == "__main__":
    main()
