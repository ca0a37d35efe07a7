"""The guard shared by the standing fuzz suites: an alarm against hangs, tracemalloc against allocations that
grow with a number read from the input, and only the project's typed errors may escape a case."""
import signal, tracemalloc
import pytest
from nac_lab.binio import NacLabError

class Hang(Exception):
    "A fuzz case ran past its alarm."

def _alarm(*_): raise Hang()

@pytest.fixture(autouse=True)
def alarm_handler():
    "Turn SIGALRM into `Hang` for the test (import this fixture into a fuzz module to use it)."
    old = signal.signal(signal.SIGALRM, _alarm)
    yield
    signal.signal(signal.SIGALRM, old)

def guarded(fn, what, limit_s=10, mem_base=16 << 20, per_byte=200, size=0, traced=True):
    "Run `fn()` under the alarm and (optionally) tracemalloc; return its result or the typed error it raised."
    if traced: tracemalloc.start()
    signal.alarm(limit_s)
    try: return fn()
    except NacLabError as ex: return ex
    except Hang: pytest.fail(f'{what}: no answer within {limit_s} s')
    except Exception as ex: pytest.fail(f'{what}: {type(ex).__name__}: {ex}')
    finally:
        signal.alarm(0)
        if traced:
            _, peak = tracemalloc.get_traced_memory(); tracemalloc.stop()
            assert peak < mem_base + per_byte * size, f'{what}: peak {peak} bytes for a {size}-byte input'
