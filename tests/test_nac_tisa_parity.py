"""TISA parity: tokenizers trained here with HuggingFace `tokenizers` (no downloads) encode and decode exactly alike
after compilation to TISA, on a held-out corpus with Unicode, whitespace runs, digits and emoji."""
import json, random
import pytest

tokenizers = pytest.importorskip('tokenizers')
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, processors, trainers, Regex
from nac_lab.nac import tisa
from nac_lab.nac.format import NacFile, read_nac, write_nac

WORDS = ('the quick brown fox jumps over lazy dog tokenizer model compile parity encode decode byte level '
         'merge vocabulary unigram wordpiece accelerator compiler tensor kernel memory schedule '
         "don't it's we're they've I'm can't Hello WORLD CamelCase snake_case x86_64 3.14159 2026 42 007 1,000,000 "
         'Ünïcödé café naïve résumé Straße Über façade crème brûlée piñata São Paulo '
         'Ελληνικά λέξη Σοφία ΟΔΟΣ русский язык Привет мир עברית العربية हिन्दी ไทย '
         '中文 分词 日本語 テスト 한국어 토큰 ｆｕｌｌｗｉｄｔｈ ﬁ ① Ⅻ ½ '
         '🙂 🚀 👍🏽 🇫🇷 👨‍👩‍👧 ❤️ ✨ 🤖').split(' ')
PUNCT = list('.,;:!?()[]{}"\'-–—…/\\@#$%^&*+=<>|~`')
SPACES = [' ', ' ', ' ', '  ', '   ', '\t', '\n', ' \n ', '\u00a0', '\u3000', '\u2003', '\r\n', '    ']

def line(rng):
    out = []
    for _ in range(rng.randint(1, 14)):
        r = rng.random()
        if r < 0.7: w = rng.choice(WORDS)
        elif r < 0.8: w = str(rng.randint(0, 10 ** rng.randint(1, 9)))
        elif r < 0.9: w = ''.join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3)))
        else: w = ''.join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa1, 0x24f), rng.randint(0x370, 0x4ff),
                                         rng.randint(0x4e00, 0x4e80), rng.randint(0x1f600, 0x1f64f)])) for _ in range(rng.randint(1, 5)))
        out.append(w); out.append(rng.choice(SPACES))
    s = ''.join(out)
    if rng.random() < 0.1: s = rng.choice(SPACES) + s
    return s.rstrip('\n') if rng.random() < 0.5 else s

TRAIN = [line(random.Random(k)) for k in range(1500)]
HELD = [line(random.Random(10 ** 6 + k)) for k in range(1000)]
HELD += ['', ' ', '   ', '\t\t', 'a', '🙂', '\u00e9', 'e\u0301', 'ΟΔΟΣ', 'İstanbul', 'ﬁne ①', '12345678901234567890']

def with_specials(lines, specials, seed):
    rng = random.Random(seed)
    return [l if rng.random() > 0.15 else l[:len(l) // 2] + rng.choice(specials) + l[len(l) // 2:] for l in lines]

def bpe_gpt2():
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel(); t.post_processor = processors.ByteLevel(trim_offsets=True)
    sp = ['<|endoftext|>', '<|pad|>']
    t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=900, special_tokens=sp,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return t, sp

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

def bpe_llama3():
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), 'isolated'),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    sp = ['<|begin_of_text|>', '<|end_of_text|>']
    t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=700, special_tokens=sp,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    t.post_processor = processors.TemplateProcessing(single='<|begin_of_text|> $A', special_tokens=[('<|begin_of_text|>',
                                                                                                     t.token_to_id('<|begin_of_text|>'))])
    return t, sp

def wordpiece_bert():
    t = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.decoder = decoders.WordPiece()
    sp = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    t.train_from_iterator(TRAIN, trainers.WordPieceTrainer(vocab_size=700, special_tokens=sp, show_progress=False))
    t.post_processor = processors.TemplateProcessing(single='[CLS] $A [SEP]', special_tokens=[('[CLS]', t.token_to_id('[CLS]')),
                                                                                              ('[SEP]', t.token_to_id('[SEP]'))])
    return t, sp

def unigram_t5():
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(' {2,}'), ' ')])
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme='always')
    t.decoder = decoders.Metaspace(replacement='▁', prepend_scheme='always')
    sp = ['<pad>', '</s>', '<unk>']
    t.train_from_iterator(TRAIN, trainers.UnigramTrainer(vocab_size=1200, special_tokens=sp, unk_token='<unk>', show_progress=False))
    t.post_processor = processors.TemplateProcessing(single='$A </s>', special_tokens=[('</s>', t.token_to_id('</s>'))])
    return t, sp

# further normalizers, pre-tokenizers, split behaviours, decoders and a normalized (non-special) added token
def bpe_mixed():
    t = Tokenizer(models.BPE(unk_token='[UNK]'))
    t.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(), normalizers.Strip(),
                                         normalizers.Replace('q', 'k')])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=600, special_tokens=['[UNK]', '<sep>'], show_progress=False))
    t.add_tokens([tokenizers.AddedToken('new york', normalized=True)])
    return t, ['<sep>', 'New York']

def wordpiece_mixed():
    t = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    t.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Prepend('>')])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation('contiguous'),
                                               pre_tokenizers.Split(Regex(r'\d+'), 'merged_with_previous'),
                                                   pre_tokenizers.Split('-', 'merged_with_next'),
                                               pre_tokenizers.Digits(individual_digits=False)])
    t.decoder = decoders.WordPiece(cleanup=False)
    t.train_from_iterator(TRAIN, trainers.WordPieceTrainer(vocab_size=800, special_tokens=['[UNK]', '[X]'], show_progress=False))
    return t, ['[X]']

def unigram_mixed():
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r'\s+'), 'removed'),
                                               pre_tokenizers.Metaspace(replacement='_', prepend_scheme='never', split=False)])
    t.decoder = decoders.Sequence([decoders.Replace('_', ' '), decoders.Strip(' ', 1, 0)])
    t.train_from_iterator(TRAIN, trainers.UnigramTrainer(vocab_size=1500, special_tokens=['<unk>', '<x>'], unk_token='<unk>',
                                                         show_progress=False))
    return t, ['<x>']

def with_byte_tokens(t):
    "Put the 256 `<0xHH>` byte tokens into the model vocabulary (as Llama-2's tokenizer.json has them) and turn on byte fallback."
    j = json.loads(t.to_str()); v = j['model']['vocab']
    if isinstance(v, dict):
        n = len(v) + len(j['added_tokens'])
        for b in range(256): v[f'<0x{b:02X}>'] = n + b
    else: v += [[f'<0x{b:02X}>', -20.0] for b in range(256)]
    j['model']['byte_fallback'] = True
    return Tokenizer.from_str(json.dumps(j))

def bpe_llama2():
    "SentencePiece-style BPE (Llama-2): Prepend/Replace normalizer, no pre-tokenizer, byte fallback, fused unknowns."
    t = Tokenizer(models.BPE(unk_token='<unk>', fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend('▁'), normalizers.Replace(' ', '▁')])
    t.decoder = decoders.Sequence([decoders.Replace('▁', ' '), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(' ', 1, 0)])
    t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=700, special_tokens=['<unk>', '<s>', '</s>'], limit_alphabet=120,
                                                     show_progress=False))
    t = with_byte_tokens(t)
    t.post_processor = processors.TemplateProcessing(single='<s> $A', special_tokens=[('<s>', t.token_to_id('<s>'))])
    return t, ['<s>', '</s>']

def unigram_bytes():
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()])
    t.train_from_iterator(TRAIN, trainers.UnigramTrainer(vocab_size=1500, special_tokens=['<unk>', '<x>'], unk_token='<unk>',
                                                         show_progress=False))
    return with_byte_tokens(t), ['<x>']

def bpe_mistral():
    "BPE after Metaspace with the `first` prepend scheme and no split (Mistral-style), byte fallback."
    t = Tokenizer(models.BPE(unk_token='<unk>', fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme='first', split=False)
    t.decoder = decoders.Sequence([decoders.Metaspace(replacement='▁', prepend_scheme='first'), decoders.ByteFallback(), decoders.Fuse()])
    t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=700, special_tokens=['<unk>', '<s>', '</s>'], limit_alphabet=150,
                                                     show_progress=False))
    return with_byte_tokens(t), ['<s>', '</s>']

def bpe_roberta():
    "RoBERTa-style byte-level BPE: <mask> strips the spaces before it; plus an rstrip token and a single-word token."
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=800, special_tokens=['<s>', '<pad>', '</s>', '<unk>'],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    t.add_special_tokens([tokenizers.AddedToken('<mask>', lstrip=True, normalized=False), tokenizers.AddedToken('[R]', rstrip=True,
                                                                                                                normalized=False)])
    t.add_tokens([tokenizers.AddedToken('fox', single_word=True, normalized=False)])
    t.post_processor = processors.RobertaProcessing(('</s>', t.token_to_id('</s>')), ('<s>', t.token_to_id('<s>')))
    return t, ['<mask>', '  <mask>', '[R]', '[R]  ', ' fox ', 'fox', 'x<mask>y', 'jumps[R] ']

def wordlevel():
    t = Tokenizer(models.WordLevel(unk_token='[UNK]'))
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.decoder = decoders.WordPiece()
    t.train_from_iterator(TRAIN, trainers.WordLevelTrainer(vocab_size=400, special_tokens=['[UNK]', '[SEP]'], show_progress=False))
    return t, ['[SEP]']

KINDS = {'bpe_gpt2': bpe_gpt2, 'bpe_llama3': bpe_llama3, 'wordpiece_bert': wordpiece_bert, 'unigram_t5': unigram_t5,
         'bpe_mixed': bpe_mixed, 'wordpiece_mixed': wordpiece_mixed, 'unigram_mixed': unigram_mixed,
         'bpe_llama2': bpe_llama2, 'unigram_bytes': unigram_bytes, 'bpe_mistral': bpe_mistral, 'bpe_roberta': bpe_roberta,
         'wordlevel': wordlevel}

@pytest.fixture(scope='module', params=list(KINDS))
def pair(request):
    hf, sp = KINDS[request.param]()
    return request.param, hf, tisa.compile(json.loads(hf.to_str())), sp

def test_encode_parity(pair):
    name, hf, tk, sp = pair
    lines = with_specials(HELD, sp, 7)
    assert len(lines) >= 1000
    bad = [(s, hf.encode(s).ids, tk.encode(s)) for s in lines if hf.encode(s).ids != tk.encode(s)]
    assert not bad, f'{name}: {len(bad)} mismatches, first: {bad[0]!r}'
    no = [s for s in lines[:200] if hf.encode(s, add_special_tokens=False).ids != tk.encode(s, add_special_tokens=False)]
    assert not no, no[0]

def test_decode_parity(pair):
    name, hf, tk, sp = pair
    n_rt = 0
    for s in with_specials(HELD, sp, 8):
        ids = hf.encode(s).ids
        assert tk.decode(ids) == hf.decode(ids), (name, s)
        assert tk.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False), (name, s)
        if hf.decode(ids) == s: n_rt += 1; assert tk.decode(tk.encode(s)) == s
    if name in ('bpe_gpt2', 'bpe_llama3'): assert n_rt >= 800     # byte-level BPE round-trips every line without a special token
    if name in ('bpe_llama2', 'unigram_bytes'):                     # byte fallback was exercised
        assert sum(any(hf.id_to_token(i).startswith('<0x') for i in hf.encode(s).ids) for s in HELD) >= 100

def test_save_load_and_nac(pair, tmp_path):
    name, hf, tk, sp = pair
    tk.save(tmp_path / 'tok')
    back = tisa.load(tmp_path / 'tok')
    assert back.manifest == tk.manifest and back.files == tk.files
    p = tmp_path / 'tok.json'; p.write_text(hf.to_str())
    nac = NacFile(); tisa.attach_tokenizer(nac, p)
    again = tisa.from_nac(read_nac(write_nac(nac)))
    s = HELD[3]
    assert again.encode(s) == hf.encode(s).ids
