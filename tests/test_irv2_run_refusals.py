"""#28 item 15: `irv2 run` refuses NaN weights with a typed error (as the Trillim engine does) instead of printing token 0
and exiting 0; a bad `--prompts` line is named by line and column, echoed only as a short escaped excerpt."""
import numpy as np
import pytest
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.irv2.build import build_ir, save_ir
from nac_lab.irv2.maps import RuntimeFailure
from nac_lab.irv2.run import Runtime, random_weights, save_weights

LLAMA = data_path('irv2', 'configs', 'tiny-llama.json')

@pytest.fixture(scope='module')
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp('refuse'); ir = build_ir(LLAMA, ctx=16); save_ir(ir, d / 'l.json')
    sd = random_weights(ir, 1); save_weights(sd, d / 'w.safetensors')
    bad = dict(sd); bad['model.norm.weight'] = sd['model.norm.weight'].copy(); bad['model.norm.weight'][3] = np.nan
    save_weights(bad, d / 'nan.safetensors')
    return d, ir

def test_nan_weights_are_refused_not_argmaxed(model):
    d, ir = model
    with pytest.raises(RuntimeFailure, match=r'NaN or infinite logits at position 2 \(\d+ NaN'):
        Runtime(ir, d / 'nan.safetensors', cache=d / 'cache').generate([5, 6, 7], 3)
    rc, out, err = run_cli('irv2', 'run', d / 'l.json', d / 'nan.safetensors', '--tokens', '5,6,7', '--steps', 3, '--cache', d / 'cache')
    assert rc == 1 and out == '' and 'NaN or infinite logits at position 2' in err and 'internal error' not in err
    rc, out, err = run_cli('irv2', 'run', d / 'l.json', d / 'w.safetensors', '--tokens', '5,6,7', '--steps', 3, '--cache', d / 'cache')
    assert rc == 0 and len(out.strip().split(',')) == 3                      # the same model with finite weights runs

def test_prompts_file_errors_do_not_echo_the_file(model, tmp_path):
    d, ir = model
    p = tmp_path / 'notes.txt'
    p.write_text('1,2,3\n\nroot:x:0:0:the-secret-password-is-hunter2:/root:/bin/bash\x1b[31m\n')
    rc, out, err = run_cli('irv2', 'run', d / 'l.json', d / 'w.safetensors', '--prompts', p, '--cache', d / 'cache')
    assert rc == 1 and f'--prompts {p}:3: item 1 (column 1) is not an integer' in err, err
    assert 'hunter2' not in err and '\x1b' not in err and len(err) < 300 + len(str(p)), err
    rc, out, err = run_cli('irv2', 'run', d / 'l.json', d / 'w.safetensors', '--tokens', '5, 6,x7', '--cache', d / 'cache')
    assert rc == 1 and "--tokens: item 3 (column 6) is not an integer: 'x7'" in err, err
