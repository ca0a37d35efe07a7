"""The gene miner against a brute-force enumerator: every connected node subset of size <= k, grouped by a plain
isomorphism check (networkx's DiGraphMatcher), gives the same patterns with the same supports."""
import random
from itertools import combinations
import networkx as nx
import pytest
from networkx.algorithms.isomorphism import DiGraphMatcher
from nac_lab.genome.mine import mine, model_dag
from nac_lab.genome.dag import canonical_form


def random_dag(seed: int, n: int, labels='abc', args='xy', p=0.3) -> nx.DiGraph:
    "A seeded random labelled DAG: edges only from lower to higher node numbers."
    rng = random.Random(seed)
    d = nx.DiGraph()
    for v in range(n): d.add_node(v, label=rng.choice(labels), kind='op')
    for v in range(n):
        for u in range(v):
            if rng.random() < p: d.add_edge(u, v, arg=rng.choice(args))
    return d


def brute_force(dags: dict, k: int, min_support: int) -> list:
    "The frequent patterns as a list of sets of occurrences {(model, frozenset of nodes)}, found by trying every subset."
    classes = {}            # invariant key -> [(representative sub-DAG, set of occurrences)]; the key only narrows the search
    nm = lambda a, b: a['label'] == b['label']
    em = lambda a, b: a['arg'] == b['arg']
    for name, d in dags.items():
        ops = [v for v in d if d.nodes[v].get('kind', 'op') == 'op']
        for size in range(1, k + 1):
            for sub in combinations(ops, size):
                h = d.subgraph(sub)
                if not nx.is_weakly_connected(h): continue
                key = (size, tuple(sorted(h.nodes[v]['label'] for v in h)), tuple(sorted(a for _, _, a in h.edges(data='arg'))))
                bucket = classes.setdefault(key, [])
                for rep, occ in bucket:
                    if DiGraphMatcher(rep, h, node_match=nm, edge_match=em).is_isomorphic():
                        occ.add((name, frozenset(sub))); break
                else: bucket.append((h.copy(), {(name, frozenset(sub))}))
    return [occ for b in classes.values() for _, occ in b if len({n for n, _ in occ}) >= min_support]


def mined(dags: dict, k: int, min_support: int) -> list:
    pats = mine([(n, d) for n, d in dags.items()], max_size=k, min_support=min_support, keep_occurrences=True, progress=False)
    for p in pats:
        assert p.support == len({n for n, _ in p.all_occurrences})
        assert p.occurrences == len(p.all_occurrences)
    return [{(n, frozenset(o)) for n, o in p.all_occurrences} for p in pats]


def same(a: list, b: list):
    key = lambda occ: sorted((n, sorted(map(str, o))) for n, o in occ)
    assert sorted(map(key, a)) == sorted(map(key, b))


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('min_support', [1, 3])
def test_random_dags(seed, min_support):
    dags = {f'm{i}': random_dag(100 * seed + i, n=9 + i, p=0.25 + 0.05 * i) for i in range(3)}
    ref = brute_force(dags, 4, min_support)
    assert ref                                             # the check is not vacuous
    same(mined(dags, 4, min_support), ref)


def test_symmetric_fanout():
    "One node read by four alike branches that join pairwise: classes of look-alike nodes, several orders to try."
    d = nx.DiGraph()
    d.add_node('s', label='split', kind='op')
    for b in range(4):
        d.add_node(b, label='relu', kind='op'); d.add_edge('s', b, arg='self')
    for j, (u, v) in enumerate([(0, 1), (2, 3), (1, 2)]):
        d.add_node(f'j{j}', label='add', kind='op'); d.add_edge(u, f'j{j}', arg='self'); d.add_edge(v, f'j{j}', arg='self')
    d2 = nx.relabel_nodes(d, {0: 3, 1: 2, 2: 1, 3: 0})
    dags = {'a': d, 'b': d2, 'c': random_dag(7, 10)}
    same(mined(dags, 5, 1), brute_force(dags, 5, 1))


def test_parameters_and_markers_are_not_mined():
    d = random_dag(3, 8)
    d.add_node('w', label='param:weight', kind='param'); d.add_edge('w', 0, arg='weight')
    m = model_dag('m', d)
    assert 'w' not in m.nodes and len(m.nodes) == 8


def test_zoo_models():
    "Real labelled DAGs of three zoo models (cnn, mlp and a GRU tagger), brute force at k = 3."
    import torch
    from nac_lab.nac.compiler.compile import compile as nac_compile
    from nac_lab.nac.compiler.zoo import build_model, example_inputs
    from nac_lab.nac.format.graph import NacGraph
    from nac_lab.genome.dag import labelled_dag
    torch.manual_seed(0)
    dags = {n: labelled_dag(NacGraph.from_model(nac_compile(build_model(n), example_inputs(n, 2)))) for n in ('cnn', 'mlp', 'gru')}
    ref = brute_force(dags, 3, 1)
    got = mined(dags, 3, 1)
    same(got, ref)
    # and the canonical form agrees with the isomorphism classes: one form per brute-force class, different between classes
    forms = [{canonical_form(dags[n], o) for n, o in occ} for occ in ref]
    assert all(len(f) == 1 for f in forms)
    assert len({next(iter(f)) for f in forms}) == len(forms)
