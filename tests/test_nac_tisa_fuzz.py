"""TISA robustness: damaged manifests and resource files give typed errors (TisaError / TisaFormatError with offsets),
never another exception, and a tokenizer that loads encodes and decodes random text without crashing."""
import random
import pytest
from nac_lab.nac.tisa import compile as tisa_compile
from nac_lab.nac.tisa_vm import Tisa, TisaError, TisaFormatError, decode_manifest, read_vocab, read_pairs

BERT = {'added_tokens': [{'id': k, 'content': t, 'special': True, 'normalized': False} for k, t in enumerate(['[UNK]', '[CLS]', '[SEP]'])],
        'normalizer': {'type': 'BertNormalizer', 'lowercase': True}, 'pre_tokenizer': {'type': 'BertPreTokenizer'},
        'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'continuing_subword_prefix': '##',
                  'vocab': {'[UNK]': 0, '[CLS]': 1, '[SEP]': 2, 'un': 3, '##aff': 4, '##able': 5, '!': 6, 'a': 7}},
        'post_processor': {'type': 'BertProcessing', 'sep': ['[SEP]', 2], 'cls': ['[CLS]', 1]},
        'decoder': {'type': 'WordPiece', 'prefix': '##', 'cleanup': True}}
BPE = {'added_tokens': [{'id': 5, 'content': '<s>', 'special': True, 'normalized': False}],
       'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': True, 'use_regex': True},
       'model': {'type': 'BPE', 'vocab': {**{c: k for k, c in enumerate('Ġabc')}, 'ab': 6, 'Ġa': 7}, 'merges': ['a b', 'Ġ a']},
       'decoder': {'type': 'ByteLevel'}}
UNI = {'normalizer': {'type': 'NFKC'}, 'pre_tokenizer': {'type': 'Metaspace', 'replacement': '▁', 'prepend_scheme': 'always',
                                                         'split': True},
       'model': {'type': 'Unigram', 'unk_id': 0, 'vocab': [['<unk>', 0.0], ['▁a', -1.0], ['b', -2.0], ['▁ab', -2.5], ['▁', -3.0],
                                                           ['a', -3.0]]},
       'decoder': {'type': 'Metaspace', 'replacement': '▁', 'prepend_scheme': 'always'}}

def texts(rng, n):
    alphabet = 'abc unaffable! [CLS][SEP]<s>\t\n é中🙂ﬁ'
    return [''.join(rng.choice(alphabet) for _ in range(rng.randrange(30))) for _ in range(n)]

@pytest.mark.parametrize('src', [BERT, BPE, UNI], ids=['wordpiece', 'bpe', 'unigram'])
def test_mutated_manifests(src, fuzz_cases):
    good = tisa_compile(src)
    rng = random.Random(3)
    sample = texts(rng, 5)
    kinds = {}
    for k in fuzz_cases(range(400), 'tisa manifests'):
        m = bytearray(good.manifest)
        for _ in range(rng.randrange(1, 3)): m[rng.randrange(5, len(m))] = rng.randrange(256)
        try: t = Tisa(bytes(m), good.files)
        except TisaFormatError as ex: assert ex.offset is not None; kinds['format'] = kinds.get('format', 0) + 1; continue
        except TisaError: kinds['load'] = kinds.get('load', 0) + 1; continue
        for s in sample:
            try: t.decode(t.encode(s))
            except TisaError: kinds['run'] = kinds.get('run', 0) + 1
        kinds['ok'] = kinds.get('ok', 0) + 1
    assert kinds.get('format') and kinds.get('ok'), kinds

@pytest.mark.parametrize('src', [BERT, BPE, UNI], ids=['wordpiece', 'bpe', 'unigram'])
def test_mutated_resources(src):
    good = tisa_compile(src)
    rng = random.Random(4)
    for name in good.files:
        for k in range(150):
            b = bytearray(good.files[name])
            if rng.random() < 0.3: b = b[:rng.randrange(len(b))]
            else:
                for _ in range(rng.randrange(1, 3)): b[rng.randrange(len(b))] = rng.randrange(256)
            try: t = Tisa(good.manifest, {**good.files, name: bytes(b)})
            except TisaError: continue
            for s in texts(rng, 3):
                try: t.decode(t.encode(s))
                except TisaError: pass

def test_random_bytes_readers():
    rng = random.Random(5)
    for k in range(2000):
        b = bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
        for f in (lambda: decode_manifest(b'TISA\x01' + b), lambda: read_vocab(b, b), lambda: read_pairs(b)):
            try: f()
            except TisaFormatError as ex: assert ex.offset is not None or ex.section

def test_parity_small_by_hand():
    "Small tokenizers whose ids are worked out by hand from their vocabularies."
    assert tisa_compile(BERT).encode('Unaffable!') == [1, 3, 4, 5, 6, 2]
    # each piece around <s> gets its prefix space; 'a b' (rank 0) merges before 'Ġ a' (rank 1), and 'Ġ ab' is no merge
    assert tisa_compile(BPE).encode('ab<s>abc') == [0, 6, 5, 0, 6, 3]
    assert tisa_compile(BPE).decode([0, 6, 5, 0, 6, 3]) == ' ab abc'
    assert tisa_compile(UNI).encode('ab') == [3]
