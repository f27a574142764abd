// Operating the server: /tokenize and /detokenize against HF tokenizers (the oracle), the HTTP
// worker pool at capacity with --parallel above 8 (idle keep-alive connections included: /health
// still answers and extra requests get 503), a non-streaming request whose client hangs up frees
// its slot, SIGTERM drains (running requests finish, new ones get 503, the process exits; past
// --drain-seconds the rest is cancelled), the default max_tokens cap, and a memory budget
// (--state-mb) that holds two requests' states: a third waits in the queue, then all finish.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import OpenAI from 'openai';
import { Tokenizer } from 'tokenizers';

import { MODEL, metric, skipReason as skip, sleep, startServer, synthCheckpoint, waitIdle } from './lily_server.mjs';

if (skip) console.error(`SKIP server ops tests: ${skip}`);

let dir;
test.before(() => { if (!skip) dir = synthCheckpoint(7); });
test.after(() => { if (dir) fs.rmSync(dir, { recursive: true, force: true }); });

const post = (base, route, body) => fetch(`${base}${route}`, { method: 'POST', body: JSON.stringify(body),
                                                                headers: { 'content-type': 'application/json' } });
// One request per connection through node:http (fetch's pool may hold requests back, and this
// test needs them all on the server at once). Resolves to { status, body }.
const rawPost = (port, route, body) => new Promise((resolve, reject) => {
  const data = JSON.stringify(body);
  const req = http.request({ host: '127.0.0.1', port, path: route, method: 'POST', agent: false,
                             headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
    let text = '';
    res.on('data', (d) => { text += d; });
    res.on('end', () => resolve({ status: res.statusCode, body: text }));
  });
  req.on('error', reject);
  req.end(data);
});
const chatBody = (extra) => ({ model: MODEL, messages: [{ role: 'user', content: 'Hello' }], ...extra });

test('tokenize and detokenize agree with HF tokenizers', { skip }, async () => {
  const s = await startServer(dir);
  try {
    const tok = await Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
    for (const text of ['Hello world', 'naïve café — 東京 🚀', '  spaces\n\ttabs', '<|im_start|>user\nhi<|im_end|>']) {
      const want = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
      const r = await (await post(s.base, '/tokenize', { content: text })).json();
      assert.deepEqual(r.tokens, want, text);
      assert.equal(r.count, want.length);
      const back = await (await post(s.base, '/detokenize', { tokens: want })).json();
      assert.equal(back.content, await tok.decode(want, false));
      const pieces = await (await post(s.base, '/tokenize', { content: text, with_pieces: true })).json();
      assert.deepEqual(pieces.tokens.map((p) => p.id), want);
      const bytes = Buffer.concat(pieces.tokens.map((p) => (typeof p.piece === 'string' ? Buffer.from(p.piece) : Buffer.from(p.piece))));
      assert.equal(bytes.toString(), text);
    }
    const rendered = await (await post(s.base, '/tokenize', { messages: [{ role: 'user', content: 'hi' }] })).json();
    assert.ok(rendered.count > 3);
    assert.equal((await post(s.base, '/detokenize', { tokens: [-1] })).status, 400);
    assert.equal((await post(s.base, '/tokenize', { nothing: 1 })).status, 400);
  } finally {
    s.proc.kill('SIGKILL');
  }
});

test('at capacity with --parallel 10: /health answers, idle connections wait, extra requests get 503', { skip }, async () => {
  const s = await startServer(dir, ['--test-hooks', '--parallel', '10', '--max-queue', '2']);
  const idle = [];
  try {
    // Twenty idle connections hold twenty workers (a keep-alive client between requests).
    for (let i = 0; i < 20; i++) idle.push(net.connect(s.port, '127.0.0.1'));
    // Each runs for 6 s or more: a refusal that waited for a free worker would take that long.
    const slow = () => rawPost(s.port, '/v1/chat/completions', chatBody({ max_tokens: 60, lily_step_delay_ms: 100 }));
    const running = Array.from({ length: 12 }, slow);  // 10 decode, 2 wait in the queue
    let h;
    for (let i = 0; i < 100; i++) {  // all admitted: 10 running, 2 waiting
      h = await (await fetch(`${s.base}/health`)).json();
      if (h.running === 10 && h.queue_depth === 2) break;
      await sleep(50);
    }
    assert.deepEqual([h.running, h.queue_depth], [10, 2]);
    const t0 = Date.now();
    assert.equal((await fetch(`${s.base}/health`)).status, 200);
    const extra = await Promise.all([slow(), slow(), slow()]);
    assert.deepEqual(extra.map((r) => r.status), [503, 503, 503]);
    assert.ok(Date.now() - t0 < 4000, `answered in ${Date.now() - t0} ms`);
    const done = await Promise.all(running);
    assert.deepEqual(done.map((r) => r.status), Array(12).fill(200));
  } finally {
    for (const c of idle) c.destroy();
    s.proc.kill('SIGKILL');
  }
});

test('a non-streaming request whose client hangs up is cancelled and frees its slot', { skip }, async () => {
  const s = await startServer(dir, ['--test-hooks', '--parallel', '2']);
  try {
    const before = await metric(s.base, 'lily_completion_tokens_total');
    const ac = new AbortController();
    const r = fetch(`${s.base}/v1/chat/completions`, { method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
                                                      body: JSON.stringify(chatBody({ max_tokens: 300, lily_step_delay_ms: 20 })) });
    await sleep(400);
    ac.abort();
    await r.catch(() => null);
    const t0 = Date.now();
    await waitIdle(s.base);
    assert.ok(Date.now() - t0 < 5000, `the slot was busy ${Date.now() - t0} ms after the client left`);
    const generated = (await metric(s.base, 'lily_completion_tokens_total')) - before;
    assert.ok(generated < 100, `generated ${generated} of 300 tokens: the request ran on after its client left`);
  } finally {
    s.proc.kill('SIGKILL');
  }
});

test('SIGTERM drains: running requests finish, new ones get 503, then the process exits', { skip }, async () => {
  const s = await startServer(dir, ['--test-hooks']);
  const client = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'x', maxRetries: 0 });
  const stream = await client.chat.completions.create(chatBody({ max_tokens: 30, lily_step_delay_ms: 30, stream: true }));
  const finishing = (async () => {
    let finish, n = 0;
    for await (const c of stream) {
      n++;
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    return { finish, n };
  })();
  await sleep(200);
  s.proc.kill('SIGTERM');
  await sleep(100);
  const refused = await post(s.base, '/v1/chat/completions', chatBody({ max_tokens: 2 }));
  assert.equal(refused.status, 503);
  assert.equal((await refused.json()).error.code, 'shutting_down');
  const { finish, n } = await finishing;
  assert.equal(finish, 'length');
  assert.ok(n >= 30);
  const { code } = await s.exited;
  assert.equal(code, 0);
  assert.match(s.stderr(), /drained/);
});

test('SIGTERM past --drain-seconds cancels what is still running and exits', { skip }, async () => {
  const s = await startServer(dir, ['--test-hooks', '--drain-seconds', '1']);
  const long = post(s.base, '/v1/chat/completions', chatBody({ max_tokens: 1000, lily_step_delay_ms: 20 }));
  await sleep(300);
  const t0 = Date.now();
  s.proc.kill('SIGTERM');
  const r = await long;
  assert.equal(r.status, 503);
  const { code } = await s.exited;
  assert.equal(code, 0);
  assert.ok(Date.now() - t0 < 8000, `exited after ${Date.now() - t0} ms`);
});

test('a request without max_tokens gets --max-tokens-default at most', { skip }, async () => {
  const s = await startServer(dir, ['--max-tokens-default', '7']);
  try {
    const r = await (await post(s.base, '/v1/chat/completions', chatBody({}))).json();
    assert.ok(r.usage.completion_tokens <= 7);
    if (r.usage.completion_tokens === 7) assert.equal(r.choices[0].finish_reason, 'length');
  } finally {
    s.proc.kill('SIGKILL');
  }
});

// The tiny checkpoint's state: 823,296 B + 1,024 B per position. With --max-seq 1024 a request of
// prompt + max_tokens ~ 1,012 projects ~1.77 MiB: two fit in --state-mb 5, three do not.
test('--state-mb holds two requests: a third waits for memory, then all finish', { skip }, async () => {
  const s = await startServer(dir, ['--test-hooks', '--parallel', '8', '--max-seq', '1024', '--state-mb', '5']);
  try {
    assert.match(s.stderr(), /memory: .* 5\.0 MiB for sequence states/);
    assert.equal(await metric(s.base, 'lily_state_memory_budget_bytes'), 5 << 20);
    assert.equal(await metric(s.base, 'lily_requests_running_max'), 8);
    assert.equal(await metric(s.base, 'lily_state_memory_max_seq_bytes'), 823296 + 1024 * 1024);
    const slow = () => rawPost(s.port, '/v1/chat/completions', chatBody({ max_tokens: 1000, lily_step_delay_ms: 40,
                                                                          lily_forced_output: 'a b c d e f g h i j k l m n o p' }));
    const reqs = [slow(), slow(), slow()];
    let h;
    for (let i = 0; i < 100; i++) {
      h = await (await fetch(`${s.base}/health`)).json();
      if (h.running === 2 && h.queue_depth === 1) break;
      await sleep(20);
    }
    assert.deepEqual([h.running, h.queue_depth], [2, 1], 'two run, the third waits for memory');
    const reserved = await metric(s.base, 'lily_state_memory_reserved_bytes');
    assert.ok(reserved > 2 * (823296 + 1000 * 1024) && reserved <= 5 << 20, `reserved ${reserved}`);
    const done = await Promise.all(reqs);
    assert.deepEqual(done.map((r) => r.status), [200, 200, 200]);
    assert.ok((await metric(s.base, 'lily_memory_waits_total')) >= 1);
    await waitIdle(s.base);
    assert.equal(await metric(s.base, 'lily_state_memory_reserved_bytes'), 0);
    assert.equal(await metric(s.base, 'lily_state_memory_failures_total'), 0);
  } finally {
    s.proc.kill('SIGKILL');
  }
});
