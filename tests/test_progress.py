"""Progress bars appear on a terminal and nowhere else (issue 20).

`nac-lab zoo build` runs three times as a user would start it: under a pseudo-terminal it draws its own stages
(build, compile, write) and the compile's (export … schedule); with standard error piped it writes not a byte to
it; under a pseudo-terminal with NAC_LAB_PROGRESS=0 it draws nothing either. The command's own report is the same
in all three runs.
"""
import fcntl, os, pty, struct, subprocess, sys, termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = 'import sys; from nac_lab.cli import main; sys.exit(main(sys.argv[1:]))'

def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ('NAC_LAB_PROGRESS', 'COLUMNS')}
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(ROOT), env.get('PYTHONPATH')]))
    env.update(extra)
    return env

def _cmd(out): return [sys.executable, '-c', CODE, 'zoo', 'build', 'mlp', '-o', str(out)]

def _run_on_pty(cmd, env) -> tuple:
    "Run `cmd` with stdout and stderr on a fresh 100x30 pseudo-terminal; (exit code, everything it wrote)."
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 30, 100, 0, 0))
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try: b = os.read(master, 65536)
        except OSError: break          # EIO: the child closed the terminal
        if not b: break
        chunks.append(b)
    os.close(master)
    return p.wait(timeout=120), b''.join(chunks).decode('utf-8', 'replace')

def _report(text) -> list: return [l.strip() for l in text.replace('\r\n', '\n').split('\n') if l.strip()]

def test_zoo_build_progress_only_on_a_terminal(tmp_path):
    rc, tty = _run_on_pty(_cmd(tmp_path / 'a.nac'), _env())
    assert rc == 0, tty
    for shown in ('zoo build mlp', 'compile MLP', 'build]', 'compile]', 'write]',
                  'export]', 'optimise]', 'lower]', 'weights]', 'schedule]'):
        assert shown in tty, (shown, tty)
    assert '\r' in tty                                   # redrawn in place, not a line per frame

    piped = subprocess.run(_cmd(tmp_path / 'b.nac'), capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ''                            # not a byte of progress in a pipe or a log
    assert '\r' not in piped.stdout

    rc, off = _run_on_pty(_cmd(tmp_path / 'c.nac'), _env(NAC_LAB_PROGRESS='0'))
    assert rc == 0 and '\r' not in off.replace('\r\n', '\n') and 'export]' not in off, off

    def named(lines, x): return [l.replace(f'{x}.nac', '<nac>').replace(f'{x}.input.npy', '<npy>') for l in lines]
    want = named(piped.stdout.splitlines(), 'b')
    assert named(_report(off), 'c') == want, (off, want)
    for line in want:                                    # on the terminal each report line stands on a line of its own
        assert '\r' + line.replace('<nac>', 'a.nac').replace('<npy>', 'a.input.npy') + '\r\n' in tty, (line, tty)
    assert tty.endswith('\r')                            # and the last bar was erased
    assert want[0].startswith('mlp: ') and (tmp_path / 'a.nac').read_bytes() == (tmp_path / 'b.nac').read_bytes()

def test_fuzz_suites_count_cases_in_verbose_mode():
    "`pytest -v` on a terminal: a fuzz loop draws its case count past the capture; without -v it draws nothing."
    cmd = [sys.executable, '-m', 'pytest', '-p', 'no:xdist', 'tests/test_nac_tisa_fuzz.py::test_mutated_manifests', '-k', 'unigram']
    rc, verbose = _run_on_pty(cmd + ['-v'], _env())
    assert rc == 0 and 'tisa manifests: 100%' in verbose and '400/400' in verbose, verbose
    assert '\n\rtisa manifests: ' in verbose.replace('\r\n', '\n')    # on a line of its own, not over the test's name
    rc, quiet = _run_on_pty(cmd, _env())
    assert rc == 0 and 'tisa manifests' not in quiet and '1 passed' in quiet, quiet

def test_lowering_progress_only_on_a_terminal(tmp_path):
    "`nem lower` (issue 33): its stages and the tile search's layer count on a terminal, by default; not a byte in a pipe."
    built = subprocess.run([sys.executable, '-c', CODE, 'zoo', 'build', 'cnn', '--static', '-o', str(tmp_path / 'cnn.nac')],
                           capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert built.returncode == 0, built.stderr

    def lower(out): return [sys.executable, '-c', CODE, 'nem', 'lower', str(tmp_path / 'cnn.nac'), '--device', 'npm_lite', '--float',
                            '--example', str(tmp_path / 'cnn.input.npy'), '-o', str(tmp_path / out)]
    rc, tty = _run_on_pty(lower('a'), _env())
    assert rc == 0, tty
    for shown in ('lower to npm_lite', 'import]', 'tile]', 'emit]', 'check]', 'tile search', 'layer'):
        assert shown in tty, (shown, tty)
    assert '\r' in tty and tty.endswith('errors\r\n')   # drawn in place; the report comes after the bar is erased
    piped = subprocess.run(lower('b'), capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert piped.returncode == 0 and piped.stderr == '', piped.stderr   # a pipe or a log gets the report only
    assert '\r' not in piped.stdout and 'model.nem' in piped.stdout
    assert (tmp_path / 'a' / 'model.nem').read_text() == (tmp_path / 'b' / 'model.nem').read_text()
