// POST /v1/responses with the official openai SDK as the client: non-streaming and streaming (the
// SDK's own event accumulator rebuilds the response), reasoning items, text.format json_schema
// (validated by ajv), a function-call round trip continued with previous_response_id and served
// from the prefix cache, stored responses (GET, DELETE), and errors.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';

import { MODEL, skipReason as skip, startServer, synthCheckpoint } from './lily_server.mjs';

if (skip) console.error(`SKIP responses tests: ${skip}`);

let dir, server, client;
const ajv = new Ajv2020({ strict: false, validateFormats: false });

test.before(async () => {
  if (skip) return;
  dir = synthCheckpoint(5);
  server = await startServer(dir, ['--test-hooks', '--parallel', '4', '--max-seq', '2048']);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

test.after(() => {
  server?.proc.kill('SIGKILL');
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('non-streaming: reasoning item, message item, usage; reasoning.effort none turns thinking off', { skip }, async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Say hi.', max_output_tokens: 16, temperature: 0,
    lily_forced_output: 'Short thought.\n</think>\n\nHello!' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.equal(r.output[0].content[0].text, 'Short thought.');
  assert.equal(r.output[1].content[0].type, 'output_text');
  assert.equal(r.output_text, 'Hello!');
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens >= 2);
  const off = await client.responses.create({ model: MODEL, input: [{ role: 'user', content: 'Hi' }], max_output_tokens: 5,
    reasoning: { effort: 'none' }, instructions: 'Be brief.' });
  assert.ok(!off.output.some((o) => o.type === 'reasoning'));
  assert.equal(off.status, 'incomplete');
  assert.equal(off.incomplete_details.reason, 'max_output_tokens');
  assert.equal(off.instructions, 'Be brief.');
});

test('streaming: typed events in order, and the SDK accumulates the same response as non-streaming', { skip }, async () => {
  const body = { model: MODEL, input: 'Tell me something.', max_output_tokens: 24, temperature: 0 };
  const whole = await client.responses.create(body);
  const stream = client.responses.stream(body);
  const types = [];
  let seq = -1;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1);
    seq = ev.sequence_number;
  }
  const final = await stream.finalResponse();
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  assert.ok(types.includes('response.reasoning_text.delta'));
  assert.ok(types.includes('response.output_item.added') && types.includes('response.output_item.done'));
  assert.equal(final.output_text, whole.output_text);
  assert.deepEqual(final.output.map((o) => o.type), whole.output.map((o) => o.type));
  const reasoning = (r) => r.output.find((o) => o.type === 'reasoning')?.content?.[0]?.text;
  assert.equal(reasoning(final), reasoning(whole));
});

test('text.format json_schema: output_text validates against the schema', { skip }, async () => {
  const schema = { type: 'object', additionalProperties: false, required: ['title', 'score', 'labels'],
                   properties: { title: { type: 'string', maxLength: 16 }, score: { type: 'number', minimum: 0, maximum: 10 },
                                 labels: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 4 } } };
  for (const seed of [1, 2, 3]) {
    const r = await client.responses.create({ model: MODEL, input: 'Rate it.', max_output_tokens: 300, seed,
      text: { format: { type: 'json_schema', name: 'rating', strict: true, schema } } });
    assert.equal(r.status, 'completed');
    const v = JSON.parse(r.output_text);
    assert.ok(ajv.validate(schema, v), `${ajv.errorsText()}: ${r.output_text}`);
  }
  await assert.rejects(client.responses.create({ model: MODEL, input: 'x',
    text: { format: { type: 'json_schema', name: 'bad', schema: { type: 'string', pattern: 'a+' } } } }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'text.format' && /pattern/.test(e.message));
});

const tools = [{ type: 'function', name: 'lookup', description: 'Look a word up', strict: true,
                 parameters: { type: 'object', additionalProperties: false, required: ['word'],
                               properties: { word: { type: 'string', minLength: 1, maxLength: 12 } } } }];

test('function call round trip with previous_response_id, continued from the cached state', { skip }, async () => {
  const first = await client.responses.create({ model: MODEL, input: 'Look up "cat".', tools, tool_choice: 'required',
    max_output_tokens: 200, reasoning: { effort: 'none' }, seed: 4 });
  const call = first.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(first.output));
  assert.equal(call.name, 'lookup');
  assert.match(call.call_id, /^call_/);
  assert.ok(ajv.validate(tools[0].parameters, JSON.parse(call.arguments)), call.arguments);
  // Streaming the same call: the arguments arrive as deltas that add up to the final arguments.
  const stream = client.responses.stream({ model: MODEL, input: 'Look up "dog".', tools, tool_choice: 'required',
    max_output_tokens: 200, reasoning: { effort: 'none' }, seed: 8 });
  const args = new Map();  // item id -> arguments from the deltas
  stream.on('response.function_call_arguments.delta', (ev) => { args.set(ev.item_id, (args.get(ev.item_id) ?? '') + ev.delta); });
  const streamed = await stream.finalResponse();
  const calls = streamed.output.filter((o) => o.type === 'function_call');
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    assert.equal(args.get(c.id), c.arguments);
    assert.ok(ajv.validate(tools[0].parameters, JSON.parse(c.arguments)), c.arguments);
  }

  // The continuation. The first turn's reply is forced here so that its tokens are the ones the
  // template's rendering of it tokenizes to (a sampled reply may spell </tool_call> in pieces).
  const forced = await client.responses.create({ model: MODEL, input: 'Look up "cat".', tools, max_output_tokens: 200,
    reasoning: { effort: 'none' },
    lily_forced_output: '<tool_call>\n<function=lookup>\n<parameter=word>\ncat\n</parameter>\n</function>\n</tool_call>' });
  const fcall = forced.output.find((o) => o.type === 'function_call');
  assert.deepEqual(JSON.parse(fcall.arguments), { word: 'cat' });
  const second = await client.responses.create({ model: MODEL, previous_response_id: forced.id, tools, max_output_tokens: 4,
    reasoning: { effort: 'none' }, input: [{ type: 'function_call_output', call_id: fcall.call_id, output: '{"meaning":"feline"}' }] });
  assert.equal(second.previous_response_id, forced.id);
  // The new prompt extends the first turn's prompt and reply: all of it but the reply's last
  // (stop) token is in the cached state.
  assert.equal(second.usage.input_tokens_details.cached_tokens, forced.usage.input_tokens + forced.usage.output_tokens - 1);
  const got = await client.responses.retrieve(second.id);
  assert.equal(got.id, second.id);
  assert.equal(got.output_text, second.output_text);
  await client.responses.delete(second.id);
  await assert.rejects(client.responses.retrieve(second.id), (e) => e instanceof OpenAI.NotFoundError);
});

test('errors: unknown previous_response_id, unsupported tool types and input items', { skip }, async () => {
  await assert.rejects(client.responses.create({ model: MODEL, input: 'x', previous_response_id: 'resp_nope' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
  await assert.rejects(client.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].type');
  await assert.rejects(client.responses.create({ model: MODEL, input: [{ type: 'input_image', image_url: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].type');
  await assert.rejects(client.responses.create({ model: MODEL, input: 'x', max_output_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_output_tokens');
});
