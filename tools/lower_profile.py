"""Where the simulated cycles of a lowered torchvision model go: total cycles against the roofline bound, busy cycles per
unit, and per layer the span [first start, last end) with the units that were busy in it.

    python tools/lower_profile.py resnet18 [--size 224] [--device npm_pro] [--naive]
"""
from __future__ import annotations
import argparse, collections, re, time
import numpy as np
import torch


def lowered(name, size=224, device='npm_pro', tiling='search'):
    "The int8 lowering of torchvision model `name` (random weights, seed 0) at `size`×`size`, two seeded calibration samples."
    from nac_lab.bench.peers import import_torchvision
    from nac_lab.nac.compiler.compile import compile as nac_compile
    from nac_lab.lower.api import lower
    tv = import_torchvision(); torch.manual_seed(0)
    m = getattr(tv.models, name)(weights=None).eval()
    x = torch.randn(1, 3, size, size)
    nm = nac_compile(m, (x,))
    rng = np.random.default_rng(0)
    cal = [rng.standard_normal(x.shape).astype(np.float32) for _ in range(2)]
    return lower(nm, device, mode='int8', calib=cal, tiling=tiling)


def spans(res) -> dict:
    "layer -> [start, end, Counter(unit type -> busy cycles)] from the token names the emitter gives (`t<n>_L<k>_<op>...`)."
    tb, out = res.table, collections.OrderedDict()
    for j in range(tb.n):
        m = re.match(r't\d+_(L\d+_[A-Za-z]+\d*)', tb.name(j) or '')
        k = m.group(1) if m else 'other'
        s, e = float(res.start[j]), float(res.end[j])
        a = out.setdefault(k, [s, e, collections.Counter()])
        a[0], a[1] = min(a[0], s), max(a[1], e)
        a[2][re.sub(r'\[\d+\]', '', res.label(j))] += e - s
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description='profile the simulated cycles of a lowered torchvision model')
    p.add_argument('model', help='torchvision model name (e.g. resnet18, mobilenet_v2)')
    p.add_argument('--size', type=int, default=224, help='input height and width (default 224)')
    p.add_argument('--device', default='npm_pro', help='device name (default npm_pro)')
    p.add_argument('--naive', action='store_true', help='naive tiling instead of the searched one (default: searched)')
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    low = lowered(a.model, a.size, a.device, 'naive' if a.naive else 'search')
    t1 = time.perf_counter()
    res = low.simulate(); rf = low.roofline(res)
    print(f'{a.model} {a.size}x{a.size} int8 on {a.device}: lowered in {t1 - t0:.1f} s; {res.total_cycles} cycles, roofline bound '
          f'{rf["bound"]:.0f} ({rf["limit"]}), ratio {rf["ratio"]:.2f}')
    for k, (s, e, b) in spans(res).items():
        print(f'  {k:28} {s:9.0f} {e:9.0f} {e - s:8.0f}  ' + ' '.join(f'{u}={int(v)}' for u, v in b.most_common(4)))


if __name__ == '__main__': main()
