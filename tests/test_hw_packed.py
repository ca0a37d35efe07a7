"""`nac_lab.hw` reads a packed constant back through io.json 'packed' (`nem lower` packs constants into CPACK): the place is
checked, the buffer must be a plain name in the same folder, and anything else is an HwError naming io.json and the entry."""
import json
import numpy as np, pytest
from nac_lab.hw.layer import _const, HwError

def folder(tmp_path, ent, pack=None):
    (tmp_path / 'io.json').write_text(json.dumps({'packed': {'L3_conv2d_w': ent}}))
    np.save(tmp_path / 'CPACK.npy', pack if pack is not None else np.arange(256, dtype=np.uint8))
    return tmp_path

def test_reads_the_constant_at_its_offset(tmp_path):
    d = folder(tmp_path, dict(buffer='CPACK', offset=64, dtype='int8', shape=[2, 4]))
    np.testing.assert_array_equal(_const(d, 'L3_conv2d_w', np.int8, 8), np.arange(64, 72, dtype=np.uint8).view(np.int8))

@pytest.mark.parametrize('ent, msg', [
    (dict(buffer='../CPACK', offset=0, dtype='int8'), 'plain buffer name'),        # never a path out of the folder
    (dict(buffer='CPACK', offset=-1, dtype='int8'), 'byte offset >= 0'),
    (dict(buffer='CPACK', offset='0', dtype='int8'), 'byte offset >= 0'),
    (dict(offset=0, dtype='int8'), 'plain buffer name'),
    ([1, 2], 'plain buffer name'),
    (dict(buffer='CPACK', offset=250, dtype='int8'), 'at byte 250; expected 8 values of int8 inside its 256 bytes'),
    (dict(buffer='CPACK', offset=0, dtype='int32'), r'\(int32\) at byte 0'),
    (dict(buffer='OTHER', offset=0, dtype='int8'), 'OTHER.npy is missing'),
])
def test_bad_entries_are_typed_errors(tmp_path, ent, msg):
    with pytest.raises(HwError, match=msg): _const(folder(tmp_path, ent), 'L3_conv2d_w', np.int8, 8)

def test_no_entry_no_file(tmp_path):
    with pytest.raises(HwError, match=r'constant L9_w\.npy is missing'): _const(folder(tmp_path, {}), 'L9_w', np.int8, 8)
