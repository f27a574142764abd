// Deterministic, deliberately hard corpus for the tokenizer oracle test: committed seed texts
// (tests/data/tokenizer), pinned source files, and generated cases (whitespace runs, special
// token strings, emoji sequences, combining marks, NFD, random code points across scripts).
// buildCorpus() returns [{name, text}], always the same for the same repo and node_modules.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');

export function rng(seed) {  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|object_ref_start|>', '<|box_end|>',
  '<|vision_pad|>', '<tool_call>', '</tool_call>', '<|fim_prefix|>', '<|fim_middle|>', '<|file_sep|>',
  '<tool_response>', '</tool_response>', '<think>', '</think>'];
const NEAR_SPECIALS = ['<|im_end|', '<|im_', '|im_end|>', '<think', 'think>', '</think', '<<think>>',
  '<|<|im_end|>|>', '<|endoftext|><|endoftext|>', '<THINK>', '< think>', '<|im_end |>', '<|IM_END|>'];
const WS = [' ', ' ', ' ', '\t', '\n', '\n', '\r\n', '\r', '\u00a0', '\u3000', '\u2028', '\u2029', '\u0085',
  '\v', '\f', '\u200b', '\u2009', '\u202f', '\u1680', '\u180e', '\ufeff'];
const CONTRACTIONS = ["don't", "I'M", "he'S", "they'LL", "we'Ve", "'s", "''s", "it’s", "'d", "y'all",
  "O'Neill", "'RE", "rock'n'roll", "'tis", "can't've", " 's", "\n's", "'ll'll", "'ſ", "'ſt", "'Ve", "'LL", "'İ", "'ǅ"];
const EMOJI_BASE = ['😀', '👍', '👋', '🧑', '👩', '👨', '🏳', '❤', '✌', '☝', '🤝', '🫶', '🐈', '🌍', '🔥', '💯',
  '🧑‍💻', '👨‍👩‍👧‍👦', '🏳️‍🌈', '👩🏽‍🚀', '🫱🏼‍🫲🏿', '🏴󠁧󠁢󠁥󠁮󠁧󠁿', '#️⃣', '1️⃣', '©️', '🇺🇸', '🇯🇵', '🇪🇺'];
const SKIN = ['\u{1F3FB}', '\u{1F3FC}', '\u{1F3FD}', '\u{1F3FE}', '\u{1F3FF}'];
const MOJIBAKE = ['Ã©', 'Ã¨', 'â€™', 'â€œ', 'â€\u009d', 'ðŸ˜€', 'Ã\u0083Â©', '\\xC3\\x28', '%C3%A9', '\\u00e9',
  '&#233;', '&eacute;', 'ï»¿', '�', '��', 'ĠĠ', 'Ċ', 'ĉ', 'Ġthe', 'âĢĻ', 'Ã', 'Ð¿Ñ€Ð¸Ð²ÐµÑ‚'];
// Code point ranges for random "script soup": [lo, hi].
const RANGES = [
  [0x20, 0x7e], [0x80, 0xff], [0x100, 0x24f], [0x250, 0x2ff], [0x300, 0x36f], [0x370, 0x3ff],
  [0x400, 0x4ff], [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff], [0x750, 0x77f], [0x900, 0x97f],
  [0x980, 0x9ff], [0xb80, 0xbff], [0xe00, 0xe7f], [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1e00, 0x1eff],
  [0x1f00, 0x1fff], [0x2000, 0x206f], [0x20a0, 0x20cf], [0x20d0, 0x20ff], [0x2100, 0x218f], [0x2190, 0x23ff],
  [0x2460, 0x24ff], [0x2500, 0x27bf], [0x2e80, 0x2fdf], [0x3000, 0x30ff], [0x3130, 0x318f], [0x3400, 0x4dbf],
  [0x4e00, 0x9fff], [0xa000, 0xa4cf], [0xac00, 0xd7a3], [0xe000, 0xe0ff], [0xf900, 0xfaff], [0xfb00, 0xfdff],
  [0xfe00, 0xfe0f], [0xfe30, 0xfe4f], [0xff00, 0xffef], [0xfff0, 0xffff], [0x10000, 0x100ff],
  [0x1d400, 0x1d7ff], [0x1f000, 0x1faff], [0x20000, 0x2a6df], [0x2f800, 0x2fa1f], [0xe0000, 0xe007f],
  [0xf0000, 0xf00ff], [0x10fff0, 0x10ffff], [0x0, 0x1f], [0x7f, 0x9f],
];
// Strings whose NFC differs from themselves or that sit at composition edges.
const NFC_EDGE = ['\u212b', '\u2126', '\u0374', '\u037e', '\u0387', '\u1e9b\u0323', 'e\u0301', 'E\u0301\u0327',
  'a\u0308\u0301', '\u1100\u1161\u11a8', '\uac00\u11a8', '\u0f73', '\u0344', 'ﬁ', 'ｶﾞ', 'か\u3099', '\u0b47\u0b3e',
  '\u0dd9\u0dca', 'Å', 'Å', 'ñ', 'n\u0303', '\u1ff6\u0345', 'ǅ', '\u00c5\u0301', 'q\u0307\u0323', '\u0928\u093c',
  '\u2000', '\u2001', '\uf900', '\ufa10', '\u{2f800}', '\u{1d15e}', '\u{1d160}', '\u0340', '\u0341', '\u0343'];

// Blocks dense in combining marks: every code point gets a probe that exposes its combining
// class and composition (this is where Unicode versions of normalizers disagree).
const COMBINING_BLOCKS = [
  [0x300, 0x36f], [0x483, 0x489], [0x591, 0x5c7], [0x610, 0x61a], [0x64b, 0x65f], [0x670, 0x670],
  [0x6d6, 0x6ed], [0x711, 0x711], [0x730, 0x74a], [0x7a6, 0x7b0], [0x7eb, 0x7fd], [0x816, 0x82d],
  [0x859, 0x85b], [0x898, 0x8ff], [0x900, 0xdff], [0xe31, 0xece], [0xf18, 0xfc6], [0x1000, 0x109d],
  [0x1100, 0x11ff], [0x1712, 0x1734], [0x1a17, 0x1a7f], [0x1ab0, 0x1aff], [0x1b00, 0x1bf3], [0x1dc0, 0x1dff],
  [0x20d0, 0x20ff], [0x302a, 0x302f], [0x3099, 0x309a], [0xa66f, 0xa67d], [0xa69e, 0xa69f], [0xa6f0, 0xa6f1],
  [0xa802, 0xa8ff], [0xfb1d, 0xfb4f], [0xfe20, 0xfe2f], [0x101fd, 0x101fd], [0x10a0d, 0x10a3f],
  [0x10d24, 0x10d27], [0x10eab, 0x10eff], [0x10f46, 0x10f85], [0x11000, 0x11fff], [0x16af0, 0x16ff1],
  [0x1bc9e, 0x1bc9e], [0x1d165, 0x1d1ad], [0x1e000, 0x1e94a],
];

function combiningProbe() {
  const parts = [];
  for (const [lo, hi] of COMBINING_BLOCKS)
    for (let c = lo; c <= hi; c++) {
      const s = String.fromCodePoint(c);
      parts.push('a' + s + '\u0334' + s + '\u0301\u0316' + s + 'x\u0301');
    }
  return parts.join(' ');
}

function readSeed(name) { return fs.readFileSync(path.join(repo, 'tests', 'data', 'tokenizer', name), 'utf8'); }

function codeFiles() {
  const nm = path.join(here, 'node_modules');
  const files = [
    path.join(nm, 'tokenizers', 'index.d.ts'), path.join(nm, 'tokenizers', 'index.js'),
    ...['ast.ts', 'format.ts', 'index.ts', 'lexer.ts', 'parser.ts', 'runtime.ts', 'utils.ts']
      .map((f) => path.join(nm, '@huggingface', 'jinja', 'src', f)),
  ];
  for (const f of fs.readdirSync(path.join(repo, 'src', 'text')).sort())
    if (/^(utf8|unicode|byte_level|bpe|regex|pipeline|added_tokens|tokenizer|stream_decoder)\.(h|cpp)$/.test(f))
      files.push(path.join(repo, 'src', 'text', f));
  return files.filter((f) => fs.existsSync(f)).map((f) => ({ name: path.relative(repo, f), text: fs.readFileSync(f, 'utf8') }));
}

export function buildCorpus({ maxBytes = Infinity } = {}) {
  const r = rng(20261202);
  const int = (n) => Math.floor(r() * n);
  const pick = (a) => a[int(a.length)];
  const cp = () => {
    const [lo, hi] = pick(RANGES);
    let c = lo + int(hi - lo + 1);
    if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
    return String.fromCodePoint(c);
  };
  const seeds = ['prose_en.txt', 'cjk.txt', 'arabic.txt', 'hindi.txt'].map((n) => ({ name: n, text: readSeed(n) }));
  const code = codeFiles();
  const all = [...seeds, ...code];
  const slice = (t) => {
    const a = int(t.length), b = Math.min(t.length, a + 1 + int(400));
    return Array.from(t.slice(a, b)).join('');  // may cut a surrogate pair: repaired below
  };
  const fixSurrogates = (s) => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');
  const ws = (n) => Array.from({ length: n }, () => pick(WS)).join('');
  const number = () => {
    const kinds = [
      () => String(int(1e9)), () => String(r() * 1e6), () => '1,234,567.89', () => '٠١٢٣٤٥٦٧٨٩', () => '१२३४५',
      () => '１２３４５', () => '²³¹⁴', () => 'Ⅻⅻ', () => '½¾⅓', () => '0x' + int(1e9).toString(16),
      () => '3.14159265358979323846264338327950288419716939937510', () => '-' + int(1e5) + 'e-' + int(30),
      () => '2026-12-02T16:51:43Z', () => '+1 (555) 010-' + String(int(1e4)).padStart(4, '0'),
      () => '𝟘𝟙𝟚𝟛', () => '①②③', () => '٣.١٤', () => String(int(10)).repeat(1 + int(60)),
    ];
    return pick(kinds)();
  };
  const emoji = () => {
    let e = pick(EMOJI_BASE);
    if (r() < 0.4) e += pick(SKIN);
    if (r() < 0.2) e += '\ufe0f';
    if (r() < 0.3) e += '\u200d' + pick(EMOJI_BASE);
    return e;
  };
  const zalgo = () => {
    let s = pick(['a', 'e', 'Z', 'ω', 'и', 'ا', 'क', '字', ' ', '1', '!']);
    const n = 1 + int(12);
    for (let i = 0; i < n; i++) s += String.fromCodePoint(pick([0x300, 0x1ab0, 0x1dc0, 0x20d0, 0xfe20]) + int(16));
    return s;
  };
  const fragment = () => {
    switch (int(14)) {
      case 0: return ws(1 + int(r() < 0.2 ? 400 : 12));
      case 1: return pick(r() < 0.7 ? SPECIALS : NEAR_SPECIALS);
      case 2: return number();
      case 3: return pick(CONTRACTIONS);
      case 4: return emoji();
      case 5: return zalgo();
      case 6: return slice(pick(all).text).normalize(pick(['NFD', 'NFKD', 'NFC', 'NFKC']));
      case 7: return Array.from({ length: 1 + int(30) }, cp).join('');
      case 8: return pick(MOJIBAKE);
      case 9: return pick(NFC_EDGE);
      case 10: return slice(pick(all).text).replace(/\n/g, '\r\n');
      case 11: return pick(['!', '?', '...', '—', '--', '==>', '/*', '*/', '{{', '}}', '\\', '"', "'", '`']).repeat(1 + int(20));
      default: return slice(pick(all).text);
    }
  };

  const docs = [];
  let total = 0;
  const push = (name, text) => {
    text = fixSurrogates(text);
    if (total >= maxBytes) return;
    docs.push({ name, text });
    total += Buffer.byteLength(text, 'utf8');
  };
  for (const s of all) push(s.name, s.text);
  for (const s of seeds) {
    push(s.name + ':NFD', s.text.normalize('NFD'));
    push(s.name + ':NFKD', s.text.normalize('NFKD'));
    push(s.name + ':CRLF', s.text.replace(/\n/g, '\r\n'));
  }
  push('code:tabs+CRLF', code.map((c) => c.text).join('\n').slice(0, 60000).replace(/ {2}/g, '\t').replace(/\n/g, '\r\n'));
  // Long runs that stress the regex and the merge loop.
  push('long:spaces', ' '.repeat(20000) + 'x' + ' '.repeat(5000));
  push('long:newlines', '\n'.repeat(5000) + ' \n'.repeat(2000) + '\r\n'.repeat(3000) + '\t \n \t'.repeat(500));
  push('long:letter', 'a'.repeat(30000));
  push('long:word', 'ab'.repeat(5000) + ' ' + 'x'.repeat(3000) + 'yz'.repeat(4000));
  push('long:digits', '1234567890'.repeat(2000));
  push('long:punct', '!?'.repeat(6000) + '=' .repeat(5000) + '-'.repeat(3000));
  push('long:cjk', '中文字符'.repeat(3000));
  push('long:emoji', Array.from({ length: 3000 }, emoji).join(''));
  push('long:zalgo', Array.from({ length: 2000 }, zalgo).join(''));
  push('long:specials', Array.from({ length: 2000 }, () => pick(SPECIALS) + ws(int(3))).join(''));
  push('edge:empty', '');
  push('edge:one-space', ' ');
  push('edge:nfc', NFC_EDGE.join(' ') + NFC_EDGE.join(''));
  push('edge:mojibake', MOJIBAKE.join(' ') + MOJIBAKE.join(''));
  push('edge:contractions', CONTRACTIONS.join(' ') + CONTRACTIONS.join('') + CONTRACTIONS.join('\n'));
  push('edge:ws-all', WS.join('') + WS.map((w) => 'a' + w + 'b').join('') + WS.map((w) => w + w + '!').join(''));
  push('edge:specials', [...SPECIALS, ...NEAR_SPECIALS].join('') + [...SPECIALS, ...NEAR_SPECIALS].join(' \n'));
  push('edge:combining-probe', combiningProbe());
  push('edge:controls', Array.from({ length: 0xa0 }, (_, i) => String.fromCharCode(i)).join(''));
  // Random mixtures until the corpus passes 1.2 MB.
  for (let d = 0; total < 1_250_000 && total < maxBytes; d++) {
    const n = 1 + int(60);
    let t = '';
    for (let i = 0; i < n; i++) t += fragment();
    push('mix:' + d, t);
  }
  return docs;
}
