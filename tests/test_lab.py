"""`make lab` (tools/lab.sh) starts JupyterLab headless, as root (it adds --allow-root) and as a normal user: it prints the
URL and token, the server answers `/api/status` with that token, refuses without it, and opens a notebook of nbs/ through the
contents API. The server runs on a free port with its Jupyter folders in a temporary directory, and is stopped afterwards."""
import importlib.util, json, os, re, shutil, signal, socket, subprocess, time, urllib.error, urllib.request
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec('jupyterlab') is None,
                                reason='jupyterlab is not installed (it is a dev requirement: `make install` adds it)')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None):
    req = urllib.request.Request(url, headers={'Authorization': f'token {token}'} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r: return r.status, json.loads(r.read())


def _serve(tmp_path: Path, user: str | None = None):
    "Start tools/lab.sh (as `user` through runuser when given); yield `(process, port, token from its first line)`."
    port, home = _free_port(), tmp_path / 'home'
    home.mkdir(mode=0o777); os.chmod(home, 0o777)
    mine = {'PORT': str(port), 'HOME': str(home), 'JUPYTER_CONFIG_DIR': str(home / 'cfg'), 'JUPYTER_DATA_DIR': str(home / 'data'),
            'JUPYTER_RUNTIME_DIR': str(home / 'run'), 'IPYTHONDIR': str(home / 'ipy'), 'JUPYTER_PLATFORM_DIRS': '1'}
    env = {**os.environ, **mine}
    env.pop('JUPYTER_TOKEN', None)
    cmd = ['bash', str(ROOT / 'tools' / 'lab.sh')]
    if user: cmd = ['runuser', '-u', user, '--', 'env', *[f'{k}={v}' for k, v in mine.items()], *cmd]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    first = p.stdout.readline()
    m = re.fullmatch(rf'JupyterLab: http://127\.0\.0\.1:{port}/lab/tree/nbs\?token=([0-9a-f]{{48}})\n', first)
    assert m, first
    return p, port, m.group(1)


def _stop(p):
    os.killpg(p.pid, signal.SIGTERM)
    try: p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL); p.wait()


def _check_server(p, port: int, token: str):
    base = f'http://127.0.0.1:{port}'
    deadline = time.monotonic() + 90
    while True:
        try:
            status, body = _get(f'{base}/api/status', token); break
        except (urllib.error.URLError, ConnectionError):
            assert p.poll() is None, p.stdout.read()[-3000:]
            assert time.monotonic() < deadline, 'JupyterLab did not answer within 90 s'
            time.sleep(0.5)
    assert status == 200 and 'started' in body and body.get('kernels') == 0
    with pytest.raises(urllib.error.HTTPError) as e: _get(f'{base}/api/status', None)
    assert e.value.code == 403                                   # the token is required
    status, nb = _get(f'{base}/api/contents/nbs/00_binio.ipynb', token)
    assert status == 200 and nb['type'] == 'notebook' and nb['path'] == 'nbs/00_binio.ipynb'
    assert nb['content']['cells'][0]['source'].startswith('# binio')


def test_lab_starts_as_this_user(tmp_path):
    p, port, token = _serve(tmp_path)
    try: _check_server(p, port, token)
    finally: _stop(p)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which('runuser') is None, reason='needs root (and runuser) to start it as another user')
def test_lab_starts_as_a_normal_user(tmp_path):
    os.chmod(tmp_path, 0o777)
    probe = subprocess.run(['runuser', '-u', 'nobody', '--', str(ROOT / '.venv' / 'bin' / 'python'), '-c', 'import jupyterlab'],
                           capture_output=True, text=True)
    if probe.returncode: pytest.skip(f'user nobody cannot use this checkout\'s .venv: {probe.stderr.strip()[-200:]}')
    p, port, token = _serve(tmp_path, user='nobody')
    try: _check_server(p, port, token)
    finally: _stop(p)
