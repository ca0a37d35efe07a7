"""The one grammar of `nac-lab`, checked on every subcommand that `build_parser()` has (walked, never listed): the output is
`-o/--output`, inputs are `-i/--input`, in-place is `--in-place`, every argument has help that shows its default and choices,
and a command that prints a result has `--json`."""
import argparse, json
import pytest
from nac_lab.cli import build_parser, visible_options

# Leaf commands that print no result a program would parse: they write files, stream, or serve (the reason is the value).
NO_JSON = {
    'tour': 'a guided walk for people; its files are the result',
    'docs': 'writes the site',
    'nem fmt': 'prints the formatted program itself (or rewrites it --in-place)',
    'irv2 run': 'streams generated tokens',
    'trillim engine': 'starts the engine process',
    'tokenize': 'prints token ids or text, one stream',
    'schedule show': 'a listing of the program beside its schedule, for people (schedule check --json has the data)',
    'view': 'serves the model to a browser until stopped',
}
SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def walk(p, path=()):
    "`(path, parser)` of every parser under `p`, `p` included."
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items(): yield from walk(sp, path + (name,))


def leaves():
    return [(' '.join(path), sp) for path, sp in walk(build_parser())
            if path and not any(isinstance(a, argparse._SubParsersAction) for a in sp._actions)]


LEAVES = leaves()
IDS = [n for n, _ in LEAVES]


def _args(sp):
    return [a for a in sp._actions if not isinstance(a, SKIP) and a.help != argparse.SUPPRESS]


def test_walk_sees_the_commands():
    assert len(LEAVES) >= 40 and len(set(IDS)) == len(IDS)
    assert {'tour', 'docs', 'nem sim', 'nem lower', 'zoo build', 'irv2 info', 'ark check'} <= set(IDS)


@pytest.mark.parametrize('name,sp', LEAVES, ids=IDS)
def test_output_and_input_spelling(name, sp):
    for a in sp._actions:
        shown = visible_options(a)
        if set(a.option_strings) & {'-o', '--out', '--output'}:
            assert shown[:2] == ['-o', '--output'], f'{name}: output option shown as {shown}, not -o/--output'
        if set(a.option_strings) & {'-i', '--input'} and a.help != argparse.SUPPRESS:
            assert shown[:2] == ['-i', '--input'], f'{name}: input option shown as {shown}, not -i/--input'
        if '--in-place' in a.option_strings: assert shown == ['--in-place'], f'{name}: in-place shown as {shown}'
    outs = [a for a in sp._actions if a.dest in ('out', 'output') and not a.option_strings and a.help != argparse.SUPPRESS]
    assert not outs, f'{name}: the output is a shown positional; use -o/--output (keep the positional hidden)'


@pytest.mark.parametrize('name,sp', LEAVES, ids=IDS)
def test_every_argument_has_help_with_default_and_choices(name, sp):
    fmt = sp._get_formatter()
    for a in _args(sp):
        what = f'{name} {"/".join(a.option_strings) or a.dest}'
        assert a.help and len(a.help.strip()) >= 8, f'{what}: no help text'
        shown = fmt._get_help_string(a)            # the help line as --help prints it (with "(default: X)" added by nac_lab.cli)
        if a.choices is not None and not isinstance(a.choices, dict) and a.metavar is not None:
            assert all(str(c) in shown for c in a.choices), f'{what}: the metavar hides the choices and the help does not name them'
        if not (a.default is None or a.default is False or a.default == [] or a.default is argparse.SUPPRESS) and \
                not isinstance(a, (argparse._StoreTrueAction, argparse._StoreConstAction)):
            assert 'default' in shown, f'{what}: its default {a.default!r} is not shown'


@pytest.mark.parametrize('name,sp', LEAVES, ids=IDS)
def test_result_commands_have_json(name, sp):
    has_out = any('-o' in a.option_strings for a in sp._actions)
    has_json = any('--json' in a.option_strings for a in sp._actions)
    if name in NO_JSON or has_out: return
    assert has_json, f'{name} prints a result but has no --json'


def test_bad_flag_shows_the_subcommand_usage(capsys):
    with pytest.raises(SystemExit) as ex: build_parser().parse_args(['nem', 'sim', 'x.nem', '--gnatt', 'g.svg'])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and err.startswith('usage: nac-lab nem sim '), err
    assert 'did you mean --gantt?' in err, err


def test_old_spellings_still_work():
    p = build_parser()
    assert p.parse_args(['tour', '--out', 'x']).out == 'x'
    assert p.parse_args(['docs', '--out', 'x']).out == 'x'


def test_device_names_resolve_the_same_everywhere():
    "`--device npm_pro` (a shipped device) works for nem check and nem sim as it does for nem lower (issue #33)."
    from nac_lab.cli import run_cli
    from nac_lab.core import data_path
    prog = str(data_path('nem', 'examples', 'conv2d_relu_fixed.nem'))
    for cmd in ('check', 'sim'):
        rc, out, err = run_cli('nem', cmd, prog, '--device', 'npm_pro', '--json')
        assert rc == 0, (cmd, err)
        assert json.loads(out)['device'] == 'npm_pro'
    rc, out, err = run_cli('nem', 'sim', prog, '--device', 'npm_nope')
    assert rc == 1 and "device 'npm_nope' is not defined" in err, err


def test_nem_fmt_dash_i_is_deprecated(tmp_path):
    from nac_lab.cli import run_cli
    f = tmp_path / 'p.nem'
    f.write_text('const  N = 4\n')
    rc, out, err = run_cli('nem', 'fmt', '-i', str(f))
    assert rc == 0 and 'use --in-place' in err, err
    assert f.read_text() != 'const  N = 4\n'


def test_every_json_command_is_sampled_or_excused():
    from nac_lab.cliref import JSON_SAMPLES, JSON_UNSAMPLED
    sampled = {c.split(' {')[0].split(' --')[0] for _, c in JSON_SAMPLES}
    sampled = {' '.join(w for w in s.split() if not w[0].isdigit() and not w.startswith('-')) for s in sampled}
    with_json = {n for n, sp in LEAVES if any('--json' in a.option_strings for a in sp._actions)}
    assert with_json - sampled - set(JSON_UNSAMPLED) == set(), 'add a JSON_SAMPLES entry (nac_lab.cliref) for these'


@pytest.mark.parametrize('setup,cmd', __import__('nac_lab.cliref', fromlist=['JSON_SAMPLES']).JSON_SAMPLES,
                         ids=[c.split(' {')[0] for _, c in __import__('nac_lab.cliref', fromlist=['JSON_SAMPLES']).JSON_SAMPLES])
def test_json_output_parses(setup, cmd, tmp_path, capsys):
    "Every sampled `--json` command prints one JSON document, indented by 2, that parses."
    from nac_lab.cliref import run_json_sample
    obj = run_json_sample(setup, cmd, tmp_path)
    assert isinstance(obj, (dict, list)) and obj


def test_command_reference_page_is_current():
    "The stored page (nbs/03b_cli_reference.ipynb) documents every command; re-run that notebook when this fails."
    import nbformat
    from nac_lab.core import repo_root
    nb = nbformat.read(repo_root() / 'nbs' / '03b_cli_reference.ipynb', as_version=4)
    md = ''.join(''.join(o.get('data', {}).get('text/markdown', ''))
                 for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', []))
    missing = [n for n in IDS if f'### nac-lab {n}\n' not in md]
    assert not missing, f'the command reference page lacks {missing}: re-execute nbs/03b_cli_reference.ipynb'
