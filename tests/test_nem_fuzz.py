"""NEM front end robustness: mutated programs never crash the parser or the checker.

Random single-character edits (delete, duplicate, replace with a grammar character) of the bundled
examples either parse or raise NemSyntaxError with a position inside the text; the checker never raises,
it reports diagnostics.
"""
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from nac_lab.core import data_path
from nac_lab.nem.syntax import parse, NemSyntaxError
from nac_lab.nem.check import check

SOURCES = [data_path('nem', 'examples', f).read_text() for f in ('conv2d_relu.nem', 'multi_cstl.nem', 'const_example.nem')] + \
          [data_path('nem', 'devices', 'npm_pro.nem').read_text()]
CHARS = list('()[]{},=:;@<>+-*/."#\n 0123456789') + ['loop ', 'endloop', 'region', 'deps=[x]', '@resource(SEQ[0])', 'elem=i4', 'mod', '1.5', 'L1[9]']

@st.composite
def mutated(draw):
    src = draw(st.sampled_from(SOURCES))
    n = draw(st.integers(1, 4))
    for _ in range(n):
        i = draw(st.integers(0, len(src)))
        op = draw(st.sampled_from(['del', 'ins', 'dup']))
        if op == 'del': src = src[:i] + src[i + 1:]
        elif op == 'ins': src = src[:i] + draw(st.sampled_from(CHARS)) + src[i:]
        else: j = min(len(src), i + draw(st.integers(1, 40))); src = src[:j] + src[i:j] + src[j:]
    return src

@given(mutated())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutations_never_crash(src):
    try:
        parse(src, 'm.nem')
    except NemSyntaxError as ex:
        lines = src.split('\n')
        assert 1 <= ex.line <= len(lines) + 1 and ex.col >= 1
    r = check(text=src, name='m.nem', base_dir=data_path('nem', 'examples'))
    for d in r.diags:
        assert d.severity in ('error', 'warning', 'info') and d.rule and d.message
    r.format()

@pytest.mark.parametrize('src', ['', '\n\n', '# only a comment\n', 'program p:\n', ';;;\n', 'const a = 99999999999999999999 * 99999999999999999999\nbuffer B : L2 (size=a)\n',
                                 'loop i in [0..1000000000]:\n  wait(x)\nendloop\n',
                                 ''.join('  ' * k + f'loop i{k} in [0..3]:\n' for k in range(24)) + ''.join('  ' * k + 'endloop\n' for k in reversed(range(24))),
                                 'const a = ' + '(' * 3000 + '1' + ')' * 3000 + '\n', 'buffer B : L2 (size=64)\nR = region(B, 0, 64, elem=i8, shape=[100000000, 100000000, 100000000], layout=ABC)\n'])
def test_edge_inputs(src):
    r = check(text=src, name='e.nem')
    r.format()

def test_long_operator_chain_is_a_syntax_error_not_a_crash():
    # a flat chain parses into a tree as deep as it is long; the recursive passes (eval, fmt, checks)
    # must never meet it: the parser stops at MAX_EXPR_OPS operators with a positioned error
    from nac_lab.nem.syntax import MAX_EXPR_OPS
    src = 'buffer B : L2 (size=64)\nconst a = ' + ' + '.join(['1'] * 50000) + '\n'
    r = check(text=src, name='e.nem')
    assert [(d.rule, d.line, d.col) for d in r.errors] == [('syntax', 2, 11 + 4 * MAX_EXPR_OPS + 2)]
    assert 'expression too long' in r.errors[0].message
    assert len(r.format()) < 1000     # the caret line shows a window, not the 200,000-character line

def test_deepest_accepted_expressions_check_and_format():
    # the largest expression the parser accepts, inside parentheses and nested loops, goes through every pass
    from nac_lab.nem.syntax import MAX_EXPR_OPS
    from nac_lab.nem.fmt import fmt_text
    e = '(' * 100 + ' + '.join(['0'] * MAX_EXPR_OPS) + ')' * 100
    src = 'buffer B : L2 (size=64)\n' + ''.join(f'loop i{k} in [0..1]:\n' for k in range(60)) + \
          f'R = region(B, {e}, 8)\nt = transfer.async(dst=R, src=region(B, {e} + 32, 8))\n' + 'endloop\n' * 60
    r = check(text=src, name='e.nem')
    assert r.ok, r.format()
    assert fmt_text(fmt_text(src)) == fmt_text(src)
