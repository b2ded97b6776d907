"""PTX check for no-p16-deps.diff: for each wgmma with a register A operand (the PV wgmmas), does any instruction
between it and the next ``wgmma.wait_group 0`` in the text write one of its A registers (PTX forbids that before the
wait)? A scan of the straight-line text (branches not followed), so a hint, not a proof; with the diff the loop's
next P is converted at the top of the next iteration, after the wait.

    python check_pv_regs.py kernel.ptx   (the PTX of tests/sm90_compile's launch, e.g. from /tmp/sass/dump2.py)
"""
import re, sys
lines = open(sys.argv[1]).read().splitlines()
issues = 0
checked = 0
for i, ln in enumerate(lines):
    if 'wgmma.mma_async' not in ln:
        continue
    # operands: {acc...}, {a0,a1,a2,a3} (registers) or a descriptor %rd
    groups = re.findall(r'\{([^}]*)\}', ln)
    if len(groups) < 2:
        continue
    a_regs = [r.strip() for r in groups[1].split(',')]
    if not all(r.startswith('%r') for r in a_regs):
        continue
    checked += 1
    for j in range(i + 1, min(len(lines), i + 3000)):
        l2 = lines[j].strip()
        if 'wgmma.wait_group.sync.aligned 0' in l2:
            break
        if 'wgmma.wait_group' in l2 or l2.startswith('//') or not l2:
            continue
        m = re.match(r'(@%?\w+\s+)?[a-z][\w.:]*\s+([^,;]+)', l2)
        if m and 'mma_async' not in l2:
            dests = [d.strip(' {}') for d in m.group(2).split(',')] if m.group(2).startswith('{') else [m.group(2).strip()]
            hit = [d for d in dests if d in a_regs]
            if hit:
                issues += 1
                print(f"line {i+1} A={a_regs}: written at line {j+1}: {l2[:80]}")
                break
print(f"{checked} register-A wgmmas checked, {issues} with an A register written before the next wait_group 0")
