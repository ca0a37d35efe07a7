"""One helper of the browser tests: headless Chromium driven over the DevTools protocol through a pipe (`--remote-debugging-pipe`).

`--dump-dom` only hands back the DOM after a virtual-time budget; a page that waits for a click, a timer in real time or a worker
never gets there. Over the protocol a test navigates, evaluates JavaScript, clicks, reads console messages and requests, and polls
for a condition with a deadline. The pipe (fd 3 in, fd 4 out, each message JSON ended by a NUL byte) needs no port and no
websocket package. Every wait is bounded; `close()` (or leaving the `with` block) always ends Chromium."""
import fcntl, json, os, select, shutil, signal, subprocess, sys, time
from pathlib import Path

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')
FLAGS = ('--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--no-default-browser-check', '--disable-extensions',
         '--disable-background-networking', '--disable-sync', '--metrics-recording-only', '--mute-audio')

class CdpError(RuntimeError):
    "The DevTools session failed: Chromium exited, a command returned an error, or a wait ran past its deadline."

class Chromium:
    "Headless Chromium (`exe`, profile in `folder`) with one page; `events` keeps every protocol event as `(method, params)`."
    def __init__(self, folder: Path, exe: str | None = None, timeout: float = 20.0):
        exe = exe or CHROMIUM
        if exe is None: raise CdpError('no chromium on PATH')
        folder = Path(folder); folder.mkdir(parents=True, exist_ok=True)
        self.timeout, self.events, self._id, self._buf, self.session = timeout, [], 0, b'', None
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()
        # the child's ends above 10, so that moving them to 3 and 4 never overwrites one with the other
        to_child, from_child = (self._high(fd) for fd in (to_child, from_child))
        # the child wants the pipe on fds 3 and 4 exactly: a Python shim moves it there and becomes Chromium (no preexec_fn in this
        # process; dash's redirections take one-digit fds only)
        self.log = folder / 'chromium.log'
        shim = (f'import os, sys; os.dup2({to_child}, 3); os.dup2({from_child}, 4); os.close({to_child}); os.close({from_child}); '
                'os.execv(sys.argv[1], sys.argv[1:])')
        try:
            with open(self.log, 'wb') as log:     # its own process group, so that close() ends its renderer and helpers too
                self.proc = subprocess.Popen([sys.executable, '-c', shim, exe, *FLAGS, f'--user-data-dir={folder / "profile"}',
                                              '--remote-debugging-pipe', 'about:blank'], stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=log, pass_fds=(to_child, from_child), start_new_session=True)
        except BaseException:
            for fd in (self._r, self._w): os.close(fd)
            raise
        finally:
            os.close(to_child); os.close(from_child)

    @staticmethod
    def _high(fd: int) -> int:
        "A copy of `fd` numbered 10 or higher (close-on-exec; `pass_fds` hands it on); `fd` itself is closed."
        hi = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10); os.close(fd); return hi

    def __enter__(self): return self
    def __exit__(self, *exc): self.close()

    def close(self):
        "End Chromium (terminate, kill after 5 s), then whatever is left of its process group, and close the pipe."
        if self.proc.poll() is None:
            self.proc.terminate()
            try: self.proc.wait(5)
            except subprocess.TimeoutExpired: self.proc.kill(); self.proc.wait(5)
        try: os.killpg(self.proc.pid, signal.SIGKILL)           # the group this object started (its leader is self.proc)
        except (ProcessLookupError, PermissionError): pass
        for fd in (self._r, self._w):
            try: os.close(fd)
            except OSError: pass

    def _log_tail(self) -> str:
        try: return self.log.read_text(errors='replace')[-800:]
        except OSError: return ''

    def _next(self, deadline: float) -> dict | None:
        "The next message from Chromium, or None once `deadline` (time.monotonic) has passed; CdpError when Chromium has gone."
        while b'\0' not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0: return None
            if not select.select([self._r], [], [], min(left, 0.5))[0]:
                if self.proc.poll() is not None: raise CdpError(f'Chromium exited ({self.proc.returncode}): {self._log_tail()}')
                continue
            chunk = os.read(self._r, 1 << 20)
            if not chunk: raise CdpError(f'Chromium closed the DevTools pipe: {self._log_tail()}')
            self._buf += chunk
        msg, self._buf = self._buf.split(b'\0', 1)
        return json.loads(msg)

    def _keep(self, m: dict) -> None:
        if 'method' in m: self.events.append((m['method'], m.get('params', {})))

    def send(self, method: str, params: dict | None = None, *, session: str | None | bool = True, timeout: float | None = None) -> dict:
        "Send `method` (to the page's session unless `session` is None/False) and return its result; events meanwhile go to `events`."
        self._id += 1
        msg = dict(id=self._id, method=method, params=params or {})
        sid = self.session if session is True else (session or None)
        if sid: msg['sessionId'] = sid
        os.write(self._w, json.dumps(msg).encode() + b'\0')
        deadline = time.monotonic() + (timeout or self.timeout)
        while (m := self._next(deadline)) is not None:
            if m.get('id') == self._id:
                if 'error' in m: raise CdpError(f'{method}: {m["error"]}')
                return m.get('result', {})
            self._keep(m)
        raise CdpError(f'no answer to {method} within {timeout or self.timeout} s')

    def open(self, url: str, cookies: dict | None = None, block=()) -> None:
        ("A new page attached as `session` with Runtime, Log, Network and Page events on, `cookies` set for `url`, requests to URL "
         "patterns `block` (`*` wildcards) refused, then navigated to `url`.")
        target = self.send('Target.createTarget', dict(url='about:blank'), session=None)['targetId']
        self.session = self.send('Target.attachToTarget', dict(targetId=target, flatten=True), session=None)['sessionId']
        for domain in ('Runtime', 'Log', 'Network', 'Page'): self.send(f'{domain}.enable')
        for k, v in (cookies or {}).items():
            if not self.send('Network.setCookie', dict(name=k, value=str(v), url=url)).get('success', True):
                raise CdpError(f'Chromium refused cookie {k} for {url}')
        if block: self.send('Network.setBlockedURLs', dict(urls=list(block)))
        start = len(self.events)
        r = self.send('Page.navigate', dict(url=url))
        if r.get('errorText'): raise CdpError(f'navigating to {url}: {r["errorText"]}')
        self.wait_event('Page.loadEventFired', since=start)        # the new document is there (its scripts may still be working)

    def wait_event(self, method: str, since: int = 0, timeout: float | None = None) -> dict:
        "The params of the first event `method` at or after index `since` of `events`, waiting up to `timeout` s for it."
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for m, params in self.events[since:]:
                if m == method: return params
            since = len(self.events)
            m = self._next(deadline)
            if m is None: raise CdpError(f'no {method} event within {timeout or self.timeout} s')
            self._keep(m)

    def evaluate(self, expr: str):
        "The value of JavaScript `expr` in the page (awaited when it is a promise); a thrown exception is a CdpError."
        r = self.send('Runtime.evaluate', dict(expression=expr, returnByValue=True, awaitPromise=True))
        if 'exceptionDetails' in r: raise CdpError(f'{expr[:80]}: {r["exceptionDetails"].get("exception", r["exceptionDetails"])}')
        return r['result'].get('value')

    def click(self, element: str) -> None:
        "Dispatch a bubbling mouse click on the element that JavaScript expression `element` yields (CdpError when it yields none)."
        click = "new MouseEvent('click', {bubbles: true, cancelable: true, view: window})"
        if not self.evaluate(f"(() => {{ const e = {element}; if (!e) return false; e.dispatchEvent({click}); return true; }})()"):
            raise CdpError(f'nothing to click: {element} is null')

    def wait_for(self, expr: str, timeout: float | None = None, every: float = 0.1):
        "Poll JavaScript `expr` until it is truthy (returns it) or `timeout` s pass (CdpError with the console messages seen)."
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            v = self.evaluate(expr)
            if v: return v
            if time.monotonic() > deadline:
                raise CdpError(f'{expr!r} still {v!r} after {timeout or self.timeout} s; last console lines: {self.console()[-5:]}')
            self.idle(every)

    def idle(self, seconds: float) -> None:
        "Collect events for `seconds` (the page runs in real time meanwhile)."
        deadline = time.monotonic() + seconds
        while (m := self._next(deadline)) is not None: self._keep(m)

    def console(self) -> list[str]:
        "The console messages and log entries seen so far, as 'level: text'."
        out = []
        for method, p in self.events:
            if method == 'Runtime.consoleAPICalled':
                out.append(f"{p.get('type')}: {' '.join(str(a.get('value', a.get('description', ''))) for a in p.get('args', []))}")
            elif method == 'Log.entryAdded': out.append(f"{p['entry'].get('level')}: {p['entry'].get('text')}")
            elif method == 'Runtime.exceptionThrown':
                out.append(f"exception: {p['exceptionDetails'].get('exception', {}).get('description')}")
        return out

    def requests(self) -> list[str]:
        "The URLs the page requested so far, in order."
        return [p['request']['url'] for method, p in self.events if method == 'Network.requestWillBeSent']
