// POST /v1/messages with the official @anthropic-ai/sdk as the client: messages, streaming (the
// SDK's MessageStream rebuilds the message from the events), thinking off by default and on with
// a budget that ends the think block, tool use round trips with strict input schemas (validated by
// ajv), stop sequences, count_tokens, x-api-key auth and Anthropic's error shape. HF tokenizers
// counts tokens as an independent oracle.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import Ajv2020 from 'ajv/dist/2020.js';
import { Tokenizer } from 'tokenizers';

import { MODEL, skipReason as skip, startServer, synthCheckpoint } from './lily_server.mjs';

if (skip) console.error(`SKIP anthropic tests: ${skip}`);

let dir, server, keyed, client, tok;
const ajv = new Ajv2020({ strict: false, validateFormats: false });

test.before(async () => {
  if (skip) return;
  dir = synthCheckpoint(6);
  server = await startServer(dir, ['--test-hooks', '--parallel', '4', '--max-seq', '2048']);
  keyed = await startServer(dir, ['--api-key', 'sekret']);
  client = new Anthropic({ baseURL: server.base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  tok = await Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
});

test.after(() => {
  for (const s of [server, keyed]) s?.proc.kill('SIGKILL');
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

const count = async (text) => (await tok.encode(text, null, { addSpecialTokens: false })).getIds().length;

test('messages: thinking is off unless enabled; content blocks, usage and stop reasons', { skip }, async () => {
  const r = await client.messages.create({ model: MODEL, max_tokens: 10, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hi' }] });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.match(r.id, /^msg_/);
  assert.ok(!r.content.some((b) => b.type === 'thinking'));
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(r.usage.output_tokens, 10);
  const forced = await client.messages.create({ model: MODEL, max_tokens: 30, messages: [{ role: 'user', content: 'Hi' }],
    stop_sequences: ['STOP', 'END'], lily_forced_output: 'Hello there END and more' });
  assert.deepEqual(forced.content, [{ type: 'text', text: 'Hello there ' }]);
  assert.equal(forced.stop_reason, 'stop_sequence');
  assert.equal(forced.stop_sequence, 'END');
  const ended = await client.messages.create({ model: MODEL, max_tokens: 30, messages: [{ role: 'user', content: 'Hi' }],
    lily_forced_output: 'Done.' });
  assert.equal(ended.stop_reason, 'end_turn');
});

test('thinking enabled with budget_tokens: the think block ends when the budget is spent', { skip }, async () => {
  // Greedy, so the run is the same every time; the same request with a larger budget thinks on along
  // the same tokens, so the budgeted thinking must be a strict prefix of it. Counting tokens by
  // re-encoding the text is only approximate (generated tokens need not be the tokenizer's own
  // segmentation of their text), hence the slack of 2.
  const ask = (budget) => client.messages.create({ model: MODEL, max_tokens: 40, temperature: 0,
    thinking: { type: 'enabled', budget_tokens: budget }, messages: [{ role: 'user', content: 'Think.' }] });
  const r = await ask(8);
  const thinking = r.content.find((b) => b.type === 'thinking');
  const text = r.content.find((b) => b.type === 'text');
  assert.ok(thinking && text, JSON.stringify(r.content));
  // Eight thinking tokens, then </think> (forced): the answer follows within the same reply.
  const longer = (await ask(30)).content.find((b) => b.type === 'thinking');
  const cut = thinking.thinking.replace(/\uFFFD+$/u, '');  // a character cut in half by the budget
  assert.ok(longer && longer.thinking.length > cut.length && longer.thinking.startsWith(cut),
            `budget 8: ${JSON.stringify(thinking.thinking)}; budget 30: ${JSON.stringify(longer && longer.thinking)}`);
  assert.ok(await count(thinking.thinking) <= 8 + 2, `${await count(thinking.thinking)} thinking tokens: ${thinking.thinking}`);
  await assert.rejects(client.messages.create({ model: MODEL, max_tokens: 8, thinking: { type: 'enabled', budget_tokens: 8 },
    messages: [{ role: 'user', content: 'x' }] }), (e) => e instanceof Anthropic.BadRequestError);
});

test('streaming: event sequence, and MessageStream assembles what the non-streaming call returns', { skip }, async () => {
  const body = { model: MODEL, max_tokens: 24, temperature: 0, thinking: { type: 'enabled', budget_tokens: 6 },
                 messages: [{ role: 'user', content: 'Stream, please.' }] };
  const whole = await client.messages.create(body);
  const stream = client.messages.stream(body);
  const types = [];
  stream.on('streamEvent', (ev) => types.push(ev.type));
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  assert.ok(types.includes('content_block_start') && types.includes('content_block_delta') && types.includes('content_block_stop'));
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  // The second call of the same prompt reads most of it from the cache: the totals agree.
  assert.equal(final.usage.input_tokens + final.usage.cache_read_input_tokens,
               whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
  assert.ok(final.usage.cache_read_input_tokens > 0);
});

const tools = [
  { name: 'get_time', description: 'Time in a zone', strict: true,
    input_schema: { type: 'object', additionalProperties: false, required: ['zone', 'format'],
                    properties: { zone: { type: 'string', maxLength: 20 }, format: { enum: ['12h', '24h'] },
                                  seconds: { type: 'boolean' } } } },
  { name: 'add', description: 'Adds numbers', strict: true,
    input_schema: { type: 'object', additionalProperties: false, required: ['a', 'b'],
                    properties: { a: { type: 'integer', minimum: -100, maximum: 100 }, b: { type: 'number', minimum: 0, maximum: 1 } } } },
];

test('tool use: any / tool choice write valid input; the tool_result goes back in the next turn', { skip }, async () => {
  for (const [choice, seed] of [[{ type: 'any' }, 1], [{ type: 'any' }, 2], [{ type: 'tool', name: 'add' }, 3]]) {
    const r = await client.messages.create({ model: MODEL, max_tokens: 300, tools, tool_choice: { ...choice, disable_parallel_tool_use: true },
      messages: [{ role: 'user', content: 'What time is it in Oslo?' }], temperature: 1, metadata: { user_id: String(seed) } });
    assert.equal(r.stop_reason, 'tool_use', JSON.stringify(r.content));
    const uses = r.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    const use = uses[0];
    assert.match(use.id, /^toolu_/);
    if (choice.type === 'tool') assert.equal(use.name, 'add');
    const tool = tools.find((t) => t.name === use.name);
    assert.ok(ajv.validate(tool.input_schema, use.input), `${ajv.errorsText()}: ${JSON.stringify(use.input)}`);
  }
  // Streaming tool use: input_json_delta pieces parse to the final input.
  const stream = client.messages.stream({ model: MODEL, max_tokens: 300, tools, tool_choice: { type: 'tool', name: 'get_time' },
    messages: [{ role: 'user', content: 'Time?' }] });
  const partial = new Map();  // block index -> its input_json_delta pieces
  stream.on('streamEvent', (ev) => {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta')
      partial.set(ev.index, (partial.get(ev.index) ?? '') + ev.delta.partial_json);
  });
  const final = await stream.finalMessage();
  const index = final.content.findIndex((b) => b.type === 'tool_use');
  const use = final.content[index];
  assert.deepEqual(JSON.parse(partial.get(index)), use.input);
  assert.ok(ajv.validate(tools[0].input_schema, use.input));
  // Round trip: the assistant's tool_use and the user's tool_result render through the template.
  const next = await client.messages.create({ model: MODEL, max_tokens: 4, tools, messages: [
    { role: 'user', content: 'Time?' },
    { role: 'assistant', content: [{ type: 'thinking', thinking: 'Need the tool.', signature: '' }, use] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '12:00' }, { type: 'text', text: 'Thanks.' }] }] });
  assert.ok(next.usage.input_tokens + next.usage.cache_read_input_tokens > final.usage.input_tokens);
});

test('count_tokens, auth with x-api-key, and errors in Anthropic\'s shape', { skip }, async () => {
  const messages = [{ role: 'user', content: 'Count me.' }];
  const counted = await client.messages.countTokens({ model: MODEL, messages });
  const made = await client.messages.create({ model: MODEL, max_tokens: 1, messages });
  assert.equal(counted.input_tokens, made.usage.input_tokens + made.usage.cache_read_input_tokens);
  const wrong = new Anthropic({ baseURL: keyed.base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: MODEL, max_tokens: 2, messages }), (e) => {
    assert.ok(e instanceof Anthropic.AuthenticationError);
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'authentication_error');
    return true;
  });
  const right = new Anthropic({ baseURL: keyed.base, apiKey: 'sekret', maxRetries: 0 });
  assert.equal((await right.messages.create({ model: MODEL, max_tokens: 2, messages })).usage.output_tokens, 2);
  await assert.rejects(client.messages.create({ model: MODEL, messages }), (e) =>
    e instanceof Anthropic.BadRequestError && e.error.error.type === 'invalid_request_error' && /max_tokens/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: 'claude-nope', max_tokens: 2, messages }), (e) =>
    e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  await assert.rejects(client.messages.create({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }), (e) =>
    e instanceof Anthropic.BadRequestError && /image/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: MODEL, max_tokens: 2, messages, tools: [{ type: 'bash_20250124', name: 'bash' }] }),
    (e) => e instanceof Anthropic.BadRequestError);
});
