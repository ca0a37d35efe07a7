"""One helper of the lowering tests: a device that extends npm_pro_x1 with f32 variants (MAY class) the shipped devices lack."""
import shutil
from pathlib import Path
from nac_lab.core import data_path

def f32_device(folder: Path, variants) -> Path:
    "`folder/npm_f32.nem`: device npm_f32, npm_pro_x1 plus `variants` in opcode.extended (the shipped files it includes copied beside it)."
    for n in ('npm_pro', 'npm_pro_x1'): shutil.copyfile(data_path('nem', 'devices', f'{n}.nem'), folder / f'{n}.nem')
    body = ''.join(f'        {v}\n' for v in variants)
    (folder / 'npm_f32.nem').write_text('include "npm_pro_x1.nem"\n\ndevice npm_f32 extends npm_pro_x1 {\n    opcode.extended {\n'
                                        + body + '    }\n}\n')
    return folder / 'npm_f32.nem'

#: the f32 variants most lowering tests need: norms, gathers/views, float gemm without bias, softmax
F32_VARIANTS = ('norm<f32>.default', 'view<f32>.default', 'gemm.float<f32>.no_bias', 'softmax<f32>.default')
