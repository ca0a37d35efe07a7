"""TISA robustness: damaged manifests and resource files give typed errors (TisaError / TisaFormatError with offsets),
never another exception, and a tokenizer that loads encodes and decodes random text without crashing."""
import json, random, time
import pytest
from nac_lab.cli import run_cli
from nac_lab.nac.tokenizer.tisa import compile as tisa_compile
from nac_lab.nac.tokenizer.tisa_vm import (Tisa, TisaError, TisaFormatError, TisaLimitError, MAX_TEXT_CHARS, Op, Rule, decode_manifest,
                                 encode_manifest, read_vocab, read_pairs)

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


# --- text growth budget (#28 item 9) ---------------------------------------------------------------------------------------------
def amplifier(n:int=14000) -> dict:
    "The issue's tokenizer: two Replace normalizers, each turning one 'a' into `n` of them, in front of the BPE fixture."
    rep = {'type': 'Replace', 'pattern': {'String': 'a'}, 'content': 'a' * n}
    return {**BPE, 'normalizer': {'type': 'Sequence', 'normalizers': [rep, rep]}}

def test_replace_amplifier_refused_quickly(tmp_path):
    (tmp_path / 'tok.json').write_text(json.dumps(amplifier()))
    t0 = time.process_time()
    for n in (1000, 60000):            # 1000 -> 14 M characters (in budget) -> refused at op 2; 60000 -> refused at op 1 (op 0: <s>)
        rc, out, err = run_cli('tokenize', tmp_path / 'tok.json', 'a' * n, '--tokenizer-json')
        assert rc == 1 and f'on a {n}-character input: the text would grow to more than {MAX_TEXT_CHARS} characters' in err, err[:300]
        assert f'manifest op {1 if n == 60000 else 2} (REPLACE)' in err and 'Traceback' not in err
    assert time.process_time() - t0 < 20
    # a -> aaa -> 9 a's; the byte-level prefix space makes 'Ġ a' merge into 'Ġa' (id 7), then 8 times 'a' (id 1)
    assert tisa_compile(amplifier(3)).encode('a', add_special_tokens=False) == [7] + [1] * 8

GROW = [Op('REPLACE', {'pattern': 'a', 'content': 'ab' * 20}), Op('REPLACE', {'pattern': '.', 'content': 'xyz'}),
        Op('REPLACE', {'pattern': '', 'content': 'q'}), Op('REPLACE', {'pattern': 'b+', 'content': ''}), Op('PREPEND', {'text': 'Ġ' * 30}),
        Op('LOWERCASE'), Op('UNICODE_NORM', {'form': 'NFKD'}), Op('BYTE_ENCODE'), Op('FILTER_CATEGORY', {'categories': ['Mn']}),
        Op('PARTITION_RULES', {'rules': [Rule(r'\s+', 1)]})]

def test_fuzz_normalizer_programs_stay_in_budget(fuzz_cases):
    "Random normalizer programs (amplifying replaces, prepends, NFKD, byte encoding) on random text: every run ends with ids or a "
    "typed error, and the text that reaches the model never passes the budget."
    good = tisa_compile(BPE)
    rng, kinds = random.Random(9), {}
    for k in fuzz_cases(range(300), 'TISA normalizer programs'):
        prog = [rng.choice(GROW) for _ in range(rng.randrange(1, 6))] + [Op('BYTE_ENCODE'), Op('BPE_ENCODE')]
        t = Tisa(encode_manifest(prog), good.files, max_chars=600)
        text = rng.choice(texts(rng, 3) + ['a' * rng.randrange(200), '\ufdfa' * 50, 'ß' * 300])
        try:
            ps = t.pieces(text)
            assert sum(len(s) for s, _ in ps) <= max(600, len(text))
            t.encode(text); kinds['ok'] = kinds.get('ok', 0) + 1
        except TisaLimitError as ex:
            assert 'manifest op' in str(ex) and 'max_chars=600' in str(ex), ex
            kinds['limit'] = kinds.get('limit', 0) + 1
    assert kinds.get('ok', 0) >= 50 and kinds.get('limit', 0) >= 50, kinds
