// `lily render` end to end against the jinja2 goldens in tests/data/templates (written by
// tools/make_template_goldens.py): the qwen3.6 template from a model dir's chat_template.jinja, the
// Qwen3 one from tokenizer_config.json's "chat_template". A second oracle, @huggingface/jinja,
// renders the same contexts; it must agree with jinja2 wherever it implements the feature.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Template } from '@huggingface/jinja';

const here = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(here, '..', '..');
const LILY = process.env.LILY_BIN;
const skip = !LILY ? 'LILY_BIN is not set: build lily and set LILY_BIN=<path>' : false;
if (skip) console.error(`SKIP lily render tests: ${skip}`);

const golden = (name) => JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'data', 'templates', name), 'utf8'));

function modelDir(kind, template) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `lily-render-${kind}-`));
  const cfg = { bos_token: null, eos_token: '<|im_end|>' };
  if (kind === 'jinja') fs.writeFileSync(path.join(dir, 'chat_template.jinja'), template);
  else cfg.chat_template = template;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
  return dir;
}

// Cases `lily render` can express: the model dir's tokens, and --no-thinking for enable_thinking=false.
function cliCases(g) {
  return g.cases.filter((c) => (c.options.bos_token ?? '') === '' && c.options.eos_token === '<|im_end|>' &&
    (c.options.enable_thinking === undefined || c.options.enable_thinking === null || c.options.enable_thinking === false));
}

for (const [file, kind] of [['qwen3.6_chat.json', 'jinja'], ['qwen3_chat.json', 'config']]) {
  test(`lily render matches jinja2 goldens: ${file}`, { skip }, () => {
    const g = golden(file);
    const template = g.template_path ? fs.readFileSync(path.join(ROOT, g.template_path), 'utf8') : g.template;
    const dir = modelDir(kind, template);
    const cases = cliCases(g);
    assert.ok(cases.length >= 40, `only ${cases.length} cases`);
    for (const c of cases) {
      const args = ['render', '--model', dir];
      if (c.options.enable_thinking === false) args.push('--no-thinking');
      const r = spawnSync(LILY, args, { input: JSON.stringify(c.request) });
      if (c.expect.output !== undefined) {
        assert.equal(r.status, 0, `${c.name}: lily render failed: ${r.stderr}`);
        assert.equal(r.stdout.toString('utf8'), c.expect.output, c.name);
      } else {
        assert.notEqual(r.status, 0, `${c.name}: expected an error (${c.expect.message})`);
        if (c.expect.raised || c.expect.error === 'request')
          assert.ok(r.stderr.toString().includes(c.expect.message), `${c.name}: stderr ${r.stderr}`);
      }
    }
  });
}

// @huggingface/jinja is a second, independent implementation. Cases it does not support the way
// jinja2 does are listed with the reason; everything else must match jinja2 byte for byte.
const HFJS_KNOWN = {
  // JavaScript numbers: tojson writes 1e20 as 100000000000000000000, 1.5e-7 as 1.5e-7 and 3.0 as 3,
  // where Python's json.dumps writes 1e+20, 1.5e-07 and 3.0.
  'qwen3.6_chat.json:tool_call_scalar_arguments': 'JS float formatting',
  'qwen3_chat.json:tool_call_scalar_arguments': 'JS float formatting',
  // messages[0].role on an empty list: jinja2 raises UndefinedError, @huggingface/jinja renders on.
  'qwen3_chat.json:empty_messages': 'lenient undefined attribute access',
};

for (const file of ['qwen3.6_chat.json', 'qwen3_chat.json']) {
  test(`@huggingface/jinja agrees with the jinja2 goldens: ${file}`, () => {
    const g = golden(file);
    const source = g.template_path ? fs.readFileSync(path.join(ROOT, g.template_path), 'utf8') : g.template;
    const tmpl = new Template(source);
    const mismatches = [];
    for (const c of g.cases) {
      if (!c.context || HFJS_KNOWN[`${file}:${c.name}`]) continue;
      let out;
      let err = null;
      try {
        out = tmpl.render(c.context);
      } catch (e) {
        err = e;
      }
      if (c.expect.output !== undefined) {
        if (err || out !== c.expect.output) mismatches.push(`${c.name}: ${err ? `error ${err.message}` : 'output differs'}`);
      } else if (!err) {
        mismatches.push(`${c.name}: expected an error (${c.expect.message})`);
      }
    }
    assert.deepEqual(mismatches, []);
  });
}
