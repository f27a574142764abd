// Conformance of `lily serve` with the official OpenAI Node SDK as the client, on a tiny
// synthetic checkpoint (random weights, real Qwen3 tokenizer and chat template) made by the
// test. Oracles: the SDK itself (framing, error classes, stream assembly), @huggingface/jinja
// rendering the checkpoint's template and HF `tokenizers` counting prompt tokens.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';

import { LILY, MODEL, skipReason as skip, startServer, metric, waitIdle } from './lily_server.mjs';

if (skip) console.error(`SKIP api tests: ${skip}`);

let dir, main, keyed, client;

function sdk(base, opts = {}) {
  return new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000, ...opts });
}

test.before(async () => {
  if (skip) return;
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lily-api-'));
  const r = spawnSync(LILY, ['synth', '--preset', 'tiny', '--seed', '1', '--out', dir], { encoding: 'utf8' });
  assert.equal(r.status, 0, `lily synth failed: ${r.stderr}`);
  main = await startServer(dir, ['--test-hooks', '--max-queue', '1', '--parallel', '2', '--max-seq', '1024']);
  keyed = await startServer(dir, ['--api-key', 'sekret', '--max-body-mb', '1']);
  client = sdk(main.base);
});

test.after(() => {
  for (const s of [main, keyed]) s?.proc.kill('SIGTERM');
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

// The oracle prompt: the checkpoint's own template rendered by @huggingface/jinja, tokenized by
// HF tokenizers.
let oracle;
async function oraclePromptTokens(messages, { enableThinking } = {}) {
  if (!oracle) {
    oracle = {
      tmpl: new Template(fs.readFileSync(path.join(dir, 'chat_template.jinja'), 'utf8')),
      tok: await Tokenizer.fromFile(path.join(dir, 'tokenizer.json')),
    };
  }
  const ctx = { messages, add_generation_prompt: true };
  if (enableThinking !== undefined) ctx.enable_thinking = enableThinking;
  const text = oracle.tmpl.render(ctx);
  return (await oracle.tok.encode(text, null, { addSpecialTokens: false })).getIds().length;
}

const hello = [{ role: 'user', content: 'Name the two colors of a chessboard.' }];

test('models.list serves the model under both names and says the weights are random', { skip }, async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m);
  assert.deepEqual(ids.map((m) => m.id), [MODEL, path.basename(dir)]);
  assert.equal(ids[0].lily_synthetic, true);
  assert.match(ids[0].description, /random/i);
  const one = await client.models.retrieve(MODEL);
  assert.equal(one.id, MODEL);
});

test('non-streaming chat: usage matches the oracle prompt, text is split into reasoning and content', { skip }, async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 12, seed: 5, temperature: 0.9 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.prompt_tokens, await oraclePromptTokens(hello));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('streaming assembles to the same reply as non-streaming with the same seed', { skip }, async () => {
  for (const enable_thinking of [true, false]) {
    const body = { model: MODEL, messages: hello, max_tokens: 24, seed: 42, temperature: 1.0,
                   chat_template_kwargs: { enable_thinking } };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let content = '', reasoning = '', role, finish, n = 0;
    for await (const chunk of stream) {
      n++;
      assert.equal(chunk.object, 'chat.completion.chunk');
      const c = chunk.choices[0];
      if (c.delta.role) role = c.delta.role;
      content += c.delta.content ?? '';
      reasoning += c.delta.reasoning_content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.ok(n >= 2);
    assert.equal(role, 'assistant');
    assert.equal(content, whole.choices[0].message.content ?? '');
    assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
    assert.equal(finish, whole.choices[0].finish_reason);
    if (!enable_thinking) assert.equal(reasoning, '');
  }
});

test('stream_options.include_usage sends a final usage chunk with empty choices', { skip }, async () => {
  const stream = await client.chat.completions.create({
    model: MODEL, messages: hello, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.prompt_tokens, await oraclePromptTokens(hello));
  assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + last.usage.completion_tokens);
  assert.ok(chunks.slice(0, -1).every((c) => c.usage === null || c.usage === undefined));
});

test('raw completions and greedy determinism', { skip }, async () => {
  const a = await client.completions.create({ model: MODEL, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 });
  const b = await client.completions.create({ model: MODEL, prompt: 'The capital of France is', max_tokens: 8, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  assert.equal(a.choices[0].text, b.choices[0].text);
  const tok = await Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const n = (await tok.encode('The capital of France is', null, { addSpecialTokens: false })).getIds().length;
  assert.equal(a.usage.prompt_tokens, n);
});

const tools = [{
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city',
              parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                            required: ['city'] } },
}];
const callText = '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n' +
  '<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>';

test('tool calling end to end (forced model output), streaming and not, then the tool result', { skip }, async () => {
  const base = { model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 200 };
  const r = await client.chat.completions.create({ ...base, lily_forced_output: 'Let me check.\n</think>\n\n' + callText });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.reasoning_content, 'Let me check.');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.match(m.tool_calls[0].id, /^call_/);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', days: 3 });

  // Streaming, assembled by the SDK's own helper.
  const runner = client.chat.completions.stream({ ...base, chat_template_kwargs: { enable_thinking: false },
                                                  lily_forced_output: callText });
  const final = await runner.finalChatCompletion();
  const sm = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(sm.tool_calls.length, 1);
  assert.equal(sm.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(sm.tool_calls[0].function.arguments), { city: 'Paris', days: 3 });
  assert.ok(!sm.content);

  // The result goes back through the template.
  const follow = await client.chat.completions.create({
    model: MODEL, tools, max_tokens: 4, temperature: 0,
    messages: [...base.messages, { role: 'assistant', content: null, tool_calls: m.tool_calls },
               { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temp_c": 18}' }],
  });
  assert.ok(follow.usage.prompt_tokens > r.usage.prompt_tokens);

  // A malformed call falls back to content, never a broken stream.
  const bad = await client.chat.completions.create({ ...base, chat_template_kwargs: { enable_thinking: false },
                                                    lily_forced_output: '<tool_call>\n<function=nope>\n</function>\n</tool_call>' });
  assert.equal(bad.choices[0].finish_reason, 'stop');
  assert.equal(bad.choices[0].message.content, '<tool_call>\n<function=nope>\n</function>\n</tool_call>');
});

test('reasoning cut by max_tokens stays reasoning', { skip }, async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 3,
                                                   lily_forced_output: 'one two three four five six' });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.ok(r.choices[0].message.reasoning_content.startsWith('one'));
  assert.equal(r.choices[0].message.content, '');
});

test('a follow-up turn reuses the cached state (thinking off)', { skip }, async () => {
  const q1 = [{ role: 'user', content: 'Say hello.' }];
  const r1 = await client.chat.completions.create({ model: MODEL, messages: q1, chat_template_kwargs: { enable_thinking: false },
                                                    lily_forced_output: 'Hello there, friend.', prompt_cache_key: 'conv-1' });
  assert.equal(r1.choices[0].message.content, 'Hello there, friend.');
  const q2 = [...q1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'Again?' }];
  const r2 = await client.chat.completions.create({ model: MODEL, messages: q2, max_tokens: 3, temperature: 0,
                                                    chat_template_kwargs: { enable_thinking: false }, prompt_cache_key: 'conv-1' });
  // Everything turn 1 fed into the model state: its prompt and reply, all but the final token.
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, r1.usage.prompt_tokens + r1.usage.completion_tokens - 1);
  // And the prompt is the template's, with the earlier turn's empty think block kept (Lily's trick).
  const kept = [q2[0], { role: 'assistant', content: '<think>\n\n</think>\n\nHello there, friend.', reasoning_content: '' }, q2[2]];
  assert.equal(r2.usage.prompt_tokens, await oraclePromptTokens(kept, { enableThinking: false }));
});

test('with thinking on, the next turn reuses the state up to the start of the reply', { skip }, async () => {
  const q1 = [{ role: 'user', content: 'Think, then answer.' }];
  const r1 = await client.chat.completions.create({ model: MODEL, messages: q1,
                                                    lily_forced_output: 'Hmm.\n</think>\n\nFine.' });
  assert.equal(r1.choices[0].message.reasoning_content, 'Hmm.');
  assert.equal(r1.choices[0].message.content, 'Fine.');
  const q2 = [...q1, { role: 'assistant', content: 'Fine.' }, { role: 'user', content: 'More?' }];
  const r2 = await client.chat.completions.create({ model: MODEL, messages: q2, max_tokens: 2, temperature: 0 });
  // Turn 1's prompt ends "<|im_start|>assistant\n<think>\n"; turn 2 renders that turn without
  // its think block, so it shares turn 1's prompt minus "<think>" and "\n".
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, r1.usage.prompt_tokens - 2);
  assert.equal(r2.usage.prompt_tokens, await oraclePromptTokens(q2));
});

test('conversations with the same long system prompt continue from one shared snapshot of it', { skip }, async () => {
  const words = 'river stone cloud lamp paper green orange alpha bravo delta'.split(' ');
  const system = Array.from({ length: 320 }, (_, i) => words[(i * 7) % words.length]).join(' ');
  // The oracle's count of the head: the template's text up to and including the system
  // message's "<|im_end|>\n", tokenized by HF tokenizers.
  await oraclePromptTokens([{ role: 'user', content: 'x' }]);
  const text = oracle.tmpl.render({ messages: [{ role: 'system', content: system }, { role: 'user', content: 'x' }], add_generation_prompt: true });
  const headText = text.slice(0, text.indexOf('<|im_end|>\n') + '<|im_end|>\n'.length);
  const head = (await oracle.tok.encode(headText, null, { addSpecialTokens: false })).getIds().length;
  assert.ok(head >= 256, `head of ${head} tokens is under the server's --cache-shared-min`);
  const cached = [];
  for (const q of ['Who are you?', 'Name a colour.', 'Count to three.']) {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 2, temperature: 0,
                                                     messages: [{ role: 'system', content: system }, { role: 'user', content: q }] });
    cached.push(r.usage.prompt_tokens_details.cached_tokens);
  }
  assert.deepEqual(cached, [0, head, head]);
});

test('aborting a stream stops generation within a step and frees the engine', { skip }, async () => {
  const before = await metric(main.base, 'lily_completion_tokens_total');
  const stream = await client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 500, stream: true,
                                                        lily_step_delay_ms: 20, temperature: 0.7, seed: 1 });
  let n = 0;
  for await (const _ of stream) {
    if (++n === 4) stream.controller.abort();
  }
  await waitIdle(main.base);
  const generated = (await metric(main.base, 'lily_completion_tokens_total')) - before;
  assert.ok(generated < 30, `generated ${generated} tokens after abort`);
  const r = await client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 2 });
  assert.ok(r.choices[0].message);
});

async function expectError(promise, cls, status, check = () => {}) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.status, status);
    check(e);
    return true;
  });
}

// A client whose fetch rewrites the body, for the inputs the SDK itself would never send.
function clientWithBody(base, makeBody) {
  return sdk(base, { fetch: (url, init) => fetch(url, { ...init, body: makeBody(init.body) }) });
}

test('every error surfaces as the SDK error class of its status', { skip }, async () => {
  const chat = (extra) => client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 2, ...extra });
  await expectError(clientWithBody(main.base, () => '{"model": "x", "messages": [').chat.completions.create(
    { model: MODEL, messages: hello }), OpenAI.BadRequestError, 400, (e) => assert.equal(e.code, 'invalid_json'));
  await expectError(clientWithBody(main.base, (b) => Buffer.concat([Buffer.from(b.slice(0, -2)), Buffer.from([0x22, 0xff, 0x22, 0x7d])])
  ).chat.completions.create({ model: MODEL, messages: hello }), OpenAI.BadRequestError, 400,
  (e) => assert.equal(e.code, 'invalid_utf8'));
  await expectError(chat({ temperature: 'hot' }), OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'temperature'));
  await expectError(chat({ max_tokens: -1 }), OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'max_tokens'));
  await expectError(client.chat.completions.create({ model: MODEL, messages: [] }), OpenAI.BadRequestError, 400);
  await expectError(client.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }),
    OpenAI.BadRequestError, 400);
  await expectError(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 42 }] }),
    OpenAI.BadRequestError, 400);
  await expectError(client.chat.completions.create({ model: MODEL, messages: [{ role: 'assistant', content: 'hi' }] }),
    OpenAI.BadRequestError, 400);  // the template: no user query
  await expectError(chat({ n: 9 }), OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'n'));
  await expectError(chat({ response_format: { type: 'xml' } }), OpenAI.BadRequestError, 400,
    (e) => assert.equal(e.param, 'response_format.type'));
  await expectError(chat({ logit_bias: { 9707: 5 } }), OpenAI.BadRequestError, 400,
    (e) => assert.match(e.message, /'logit_bias' is not supported/));
  await expectError(chat({ max_tokens: 5000 }), OpenAI.BadRequestError, 400,
    (e) => assert.equal(e.code, 'context_length_exceeded'));
  await expectError(chat({ messages: [{ role: 'user', content: 'word '.repeat(1200) }], max_tokens: undefined }),
    OpenAI.BadRequestError, 400, (e) => assert.equal(e.code, 'context_length_exceeded'));
  await expectError(chat({ model: 'gpt-4o' }), OpenAI.NotFoundError, 404, (e) => assert.equal(e.code, 'model_not_found'));
  await expectError(client.get('/no/such/route'), OpenAI.NotFoundError, 404);
  // Unknown fields are ignored.
  const ok = await chat({ some_future_field: { a: 1 }, user: 'u1', metadata: { k: 'v' }, top_k: 5, min_p: 0.1,
                          repetition_penalty: 1.1, presence_penalty: 0.5, frequency_penalty: 0.5, stop: ['xyz'],
                          logprobs: true, top_logprobs: 3, parallel_tool_calls: true });
  assert.ok(ok.choices[0].logprobs.content.length >= 1);
  assert.equal(ok.choices[0].logprobs.content[0].top_logprobs.length, 3);

  // The keyed server: auth, body size, and test hooks refused.
  const wrong = sdk(keyed.base, { apiKey: 'wrong' });
  await expectError(wrong.chat.completions.create({ model: MODEL, messages: hello }), OpenAI.AuthenticationError, 401);
  await expectError(wrong.models.list(), OpenAI.AuthenticationError, 401);
  const right = sdk(keyed.base, { apiKey: 'sekret' });
  await expectError(right.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(2 << 20) }] }),
    OpenAI.APIError, 413);
  await expectError(right.chat.completions.create({ model: MODEL, messages: hello, lily_forced_output: 'x' }),
    OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'lily_forced_output'));
  const fine = await right.chat.completions.create({ model: path.basename(dir), messages: hello, max_tokens: 2 });
  assert.equal(fine.model, path.basename(dir));
});

test('mutated request bodies never crash the server: every answer is a 2xx or a 4xx error object', { skip }, async () => {
  const valid = JSON.stringify({ model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, ...hello], max_tokens: 1,
                                 temperature: 0.5, stop: ['x'], tools, stream: false });
  let seed = 12345;
  const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let i = 0; i < 150; i++) {
    const bytes = Buffer.from(valid);
    let body;
    switch (i % 3) {
      case 0: { for (let k = 0; k < 1 + rand(4); k++) bytes[rand(bytes.length)] = rand(256); body = bytes; break; }
      case 1: body = bytes.subarray(0, rand(bytes.length)); break;
      default: { const j = rand(bytes.length); body = Buffer.concat([bytes.subarray(0, j), Buffer.from(['null', '[]', '{}', '-1', '"', '1e999'][rand(6)]), bytes.subarray(j)]); }
    }
    const r = await fetch(`${main.base}/v1/chat/completions`, { method: 'POST', body, headers: { 'content-type': 'application/json' } });
    const text = await r.text();
    assert.ok(r.status === 200 || (r.status >= 400 && r.status < 500), `status ${r.status} for ${body}: ${text}`);
    if (r.status !== 200) assert.equal(typeof JSON.parse(text).error.message, 'string');
  }
  assert.equal((await fetch(`${main.base}/health`)).status, 200);
});

test('a full queue answers 503 with Retry-After while /health and /metrics stay responsive', { skip }, async () => {
  const slow = () => client.chat.completions.create({ model: MODEL, messages: hello, max_tokens: 40, lily_step_delay_ms: 25,
                                                       lily_forced_output: 'a b c d e f g h i j k l m n o p q r s t' });
  const running = [slow(), slow()];  // --parallel 2: both decode together
  await new Promise((r) => setTimeout(r, 150));
  const queued = slow();  // --max-queue 1: this one waits
  await new Promise((r) => setTimeout(r, 100));
  const t0 = Date.now();
  assert.equal((await fetch(`${main.base}/health`)).status, 200);
  assert.equal((await fetch(`${main.base}/metrics`)).status, 200);
  assert.ok(Date.now() - t0 < 1000);
  await expectError(slow(), OpenAI.InternalServerError, 503, (e) => assert.ok(Number(e.headers.get('retry-after')) >= 1));
  const [a, b, c] = await Promise.all([...running, queued]);  // none lost its response
  assert.equal(a.choices[0].message.reasoning_content, b.choices[0].message.reasoning_content);
  assert.equal(a.choices[0].message.reasoning_content, c.choices[0].message.reasoning_content);
});

test('/metrics reports requests by status, tokens, latency histograms and cache hits', { skip }, async () => {
  const text = await (await fetch(`${main.base}/metrics`)).text();
  assert.match(text, /lily_requests_total\{route="\/v1\/chat\/completions",status="200"\} \d+/);
  assert.match(text, /lily_requests_total\{route="\/v1\/chat\/completions",status="400"\} \d+/);
  assert.match(text, /lily_time_to_first_token_seconds_bucket\{le="\+Inf"\} [1-9]/);
  assert.match(text, /lily_inter_token_latency_seconds_count [1-9]/);
  assert.match(text, /lily_queue_depth 0/);
  assert.ok((await metric(main.base, 'lily_prefix_cache_hits_total')) >= 1);
  assert.ok((await metric(main.base, 'lily_prompt_tokens_total')) > 0);
});
