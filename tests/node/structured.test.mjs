// Structured outputs through the official openai SDK, every output validated by ajv (an
// independent JSON Schema implementation): response_format json_schema and json_object, strict
// tools (tool_choice required and named; auto is covered in tests/structured/mask_test.cpp), n > 1 choices, tool-call arguments streamed as
// they are generated, refused keywords named. On the random-weight checkpoint the text is noise,
// but it must always parse and validate.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';

import { MODEL, skipReason as skip, startServer, synthCheckpoint } from './lily_server.mjs';

if (skip) console.error(`SKIP structured tests: ${skip}`);

let dir, server, client;
// JSON Schema 2020-12 (prefixItems, $defs); formats are plain strings, as the server treats them.
const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });

test.before(async () => {
  if (skip) return;
  dir = synthCheckpoint(3);
  server = await startServer(dir, ['--test-hooks', '--parallel', '8', '--max-queue', '16', '--max-seq', '2048']);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

test.after(() => {
  server?.proc.kill('SIGKILL');
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

// Runs async job functions at most `width` at a time (the server's --parallel), results in order.
async function pool(jobs, width = 8) {
  const out = new Array(jobs.length);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < jobs.length) {
      const i = next++;
      out[i] = await jobs[i]();
    }
  }));
  return out;
}

function validate(schema, text, what) {
  let value;
  assert.doesNotThrow(() => { value = JSON.parse(text); }, `${what}: not JSON: ${text}`);
  const ok = ajv.validate(schema, value);
  assert.ok(ok, `${what}: ${ajv.errorsText()}\n${text}`);
  return value;
}

// Schemas whose strings and arrays are bounded: with enough max_tokens the output always completes.
const schemas = {
  person: { type: 'object', additionalProperties: false, required: ['name', 'age', 'email', 'tags'],
            properties: { name: { type: 'string', minLength: 1, maxLength: 20 }, age: { type: 'integer', minimum: 0, maximum: 130 },
                          email: { type: 'string', format: 'email', maxLength: 30 },
                          tags: { type: 'array', items: { type: 'string', maxLength: 8 }, minItems: 1, maxItems: 3 },
                          nickname: { type: 'string', maxLength: 10 } } },
  numbers: { type: 'object', required: ['ratio', 'temp', 'count', 'small'],
             properties: { ratio: { type: 'number', minimum: 0, maximum: 1 }, temp: { type: 'number', exclusiveMinimum: -40.5, exclusiveMaximum: 50 },
                           count: { type: 'integer', minimum: 1000, maximum: 1005 }, small: { type: 'number', minimum: 0.25, maximum: 0.3 } } },
  enums: { type: 'object', required: ['mode', 'quote', 'fixed', 'flag', 'nothing'],
           properties: { mode: { enum: ['fast', 'slow', 'medium'] }, quote: { enum: ['say "hi"', 'back\\slash', 'ünïcode ✓', 1, null] },
                         fixed: { const: { a: [1, 2], b: 'c' } }, flag: { type: 'boolean' }, nothing: { type: 'null' } } },
  nullable: { type: 'object', required: ['maybe', 'either'],
              properties: { maybe: { type: ['string', 'null'], maxLength: 6 },
                            either: { anyOf: [{ type: 'integer', minimum: -3, maximum: 3 }, { type: 'string', maxLength: 4 },
                                              { type: 'array', items: { type: 'boolean' }, maxItems: 2 }] } } },
  tree: { $defs: { node: { type: 'object', required: ['label', 'children'], additionalProperties: false,
                           properties: { label: { type: 'string', maxLength: 5 },
                                         children: { type: 'array', maxItems: 2, items: { $ref: '#/$defs/node' } } } } },
          $ref: '#/$defs/node' },
  tuple: { type: 'array', prefixItems: [{ type: 'string', maxLength: 3 }, { type: 'integer', minimum: 5, maximum: 9 }],
           items: false, minItems: 2 },
  matrix: { type: 'array', minItems: 1, maxItems: 3, items: { type: 'array', maxItems: 3, items: { type: 'integer', minimum: -9, maximum: 9 } } },
  optional: { type: 'object', properties: { a: { type: 'string', maxLength: 3 }, b: { type: 'integer', maximum: 5 },
                                            c: { type: 'object', properties: { d: { type: 'boolean' } }, additionalProperties: false } },
              additionalProperties: false },
};

test('json_schema: every output of every schema parses and validates (thinking on and off, sampled)', { skip }, async () => {
  const jobs = [];
  for (const [name, schema] of Object.entries(schemas))
    for (const enable_thinking of [false, true])
      for (const seed of [1, 2])
        jobs.push({ name, schema, enable_thinking, seed });
  const results = await pool(jobs.map((j) => async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: `Give me ${j.name} as JSON.` }], seed: j.seed, temperature: 1,
      max_tokens: 400, chat_template_kwargs: { enable_thinking: j.enable_thinking },
      response_format: { type: 'json_schema', json_schema: { name: j.name, strict: true, schema: j.schema } },
    });
    return { j, r };
  }));
  for (const { j, r } of results) {
    const what = `${j.name} thinking=${j.enable_thinking} seed=${j.seed}`;
    assert.equal(r.choices[0].finish_reason, 'stop', what);
    validate(j.schema, r.choices[0].message.content, what);
    if (!j.enable_thinking) assert.ok(!r.choices[0].message.reasoning_content, what);
  }
});

test('json_schema at the smallest budget that fits, and streamed', { skip }, async () => {
  const schema = schemas.person;
  // Smallest output (bytes): {"name":"x","age":0,"email":"","tags":[""]} = 44 bytes, plus the stop token.
  // The SDK's parse() helper: message.parsed is the JSON it read from the content.
  const r = await client.chat.completions.parse({ model: MODEL, messages: [{ role: 'user', content: 'x' }], seed: 9, max_tokens: 45,
    chat_template_kwargs: { enable_thinking: false }, response_format: { type: 'json_schema', json_schema: { name: 'p', schema } } });
  assert.equal(r.choices[0].finish_reason, 'stop');
  validate(schema, r.choices[0].message.content, 'smallest budget');
  assert.ok(ajv.validate(schema, r.choices[0].message.parsed));
  const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], seed: 4,
    max_tokens: 200, stream: true, response_format: { type: 'json_schema', json_schema: { name: 'p', schema } } });
  let content = '', finish, deltas = 0;
  for await (const c of stream) {
    if (c.choices[0]?.delta?.content) { content += c.choices[0].delta.content; deltas++; }
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  assert.ok(deltas > 3, 'the JSON streams in pieces');
  validate(schema, content, 'streamed');
});

test('json_object gives a JSON object', { skip }, async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], seed: 5, max_tokens: 120,
    chat_template_kwargs: { enable_thinking: false }, response_format: { type: 'json_object' } });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const v = JSON.parse(r.choices[0].message.content);
  assert.equal(typeof v, 'object');
  assert.ok(v !== null && !Array.isArray(v));
});

test('n choices share one prefill; each is a valid, distinct output', { skip }, async () => {
  const schema = schemas.numbers;
  const before = Number((await (await fetch(`${server.base}/metrics`)).text()).match(/lily_prompt_tokens_total (\d+)/)[1]);
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Three answers, please.' }],
    n: 3, seed: 11, max_tokens: 200, chat_template_kwargs: { enable_thinking: false },
    response_format: { type: 'json_schema', json_schema: { name: 'n', schema } } });
  const after = Number((await (await fetch(`${server.base}/metrics`)).text()).match(/lily_prompt_tokens_total (\d+)/)[1]);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) validate(schema, c.message.content, `choice ${c.index}`);
  assert.equal(new Set(r.choices.map((c) => c.message.content)).size, 3);
  assert.equal(after - before, r.usage.prompt_tokens, 'the prompt was prefilled once');
  assert.ok(r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens, 'the prompt is counted once, from choice 0');
  // Streaming n: every choice's chunks carry its index and each ends with its own finish chunk.
  const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], n: 2, max_tokens: 6,
    stream: true, stream_options: { include_usage: true } });
  const finishes = new Map();
  let usage;
  for await (const c of stream) {
    for (const ch of c.choices) if (ch.finish_reason) finishes.set(ch.index, ch.finish_reason);
    if (c.usage) usage = c.usage;
  }
  assert.deepEqual([...finishes.keys()].sort(), [0, 1]);
  assert.ok(usage.completion_tokens >= 2 && usage.completion_tokens <= 12);
});

const weather = {
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city', strict: true,
              parameters: { type: 'object', additionalProperties: false, required: ['city', 'unit', 'days'],
                            properties: { city: { type: 'string', minLength: 1, maxLength: 24 }, unit: { enum: ['c', 'f'] },
                                          days: { type: 'integer', minimum: 1, maximum: 14 },
                                          hours: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 23 }, maxItems: 3 } } } },
};
const search = {
  type: 'function',
  function: { name: 'search', strict: true,
              parameters: { type: 'object', additionalProperties: false, required: ['query'],
                            properties: { query: { type: 'string', maxLength: 30 }, limit: { type: ['integer', 'null'], minimum: 1, maximum: 5 } } } },
};

test('strict tools: required and named tool_choice constrain the arguments to the schema', { skip }, async () => {
  const jobs = [];
  for (const seed of [1, 2, 3])
    for (const enable_thinking of [false, true])
      jobs.push(() => client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], seed,
        max_tokens: 400, tools: [weather, search], tool_choice: 'required', parallel_tool_calls: false,
        chat_template_kwargs: { enable_thinking } }));
  jobs.push(() => client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Find cats.' }], seed: 7,
    max_tokens: 300, tools: [weather, search], tool_choice: { type: 'function', function: { name: 'search' } },
    chat_template_kwargs: { enable_thinking: false } }));
  const results = await pool(jobs);
  for (const [i, r] of results.entries()) {
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `job ${i}: ${JSON.stringify(c.message)}`);
    const named = i === results.length - 1;  // parallel calls allowed there: one or more, all 'search'
    if (!named) assert.equal(c.message.tool_calls.length, 1, `job ${i}: parallel_tool_calls is false`);
    for (const call of c.message.tool_calls) {
      const tool = [weather, search].find((t) => t.function.name === call.function.name);
      assert.ok(tool, call.function.name);
      if (named) assert.equal(call.function.name, 'search');
      validate(tool.function.parameters, call.function.arguments, `job ${i} ${call.function.name}`);
    }
  }
});

test('tool-call arguments stream as they are generated', { skip }, async () => {
  const runner = client.chat.completions.stream({ model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], seed: 3,
    max_tokens: 300, tools: [weather], tool_choice: 'required', chat_template_kwargs: { enable_thinking: false } });
  let pieces = 0;
  runner.on('chunk', (c) => { if (c.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments) pieces++; });
  const final = await runner.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  validate(weather.function.parameters, call.function.arguments, 'streamed call');
  assert.ok(pieces >= 4, `arguments came in ${pieces} pieces`);
  // A non-strict call written by the model (forced output) streams too: the string value
  // character by character, before the call is closed.
  const forced = '<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n' +
    '<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>';
  const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], stream: true,
    tools: [{ type: 'function', function: { ...weather.function, strict: false } }], max_tokens: 100,
    chat_template_kwargs: { enable_thinking: false }, lily_forced_output: forced });
  const args = [];
  for await (const c of stream) {
    const tc = c.choices[0]?.delta?.tool_calls?.[0];
    if (tc?.function?.arguments) args.push(tc.function.arguments);
  }
  assert.deepEqual(JSON.parse(args.join('')), { city: 'San Francisco', days: 3 });
  assert.ok(args.length >= 4, `${args.length} pieces: ${JSON.stringify(args)}`);
});

test('unsupported schema keywords are refused with a 400 that names them', { skip }, async () => {
  const bad = { type: 'object', properties: { id: { type: 'string', pattern: '^[a-z]+$' }, v: { oneOf: [{ type: 'integer' }] } } };
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'b', schema: bad } } }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, 'response_format');
    assert.match(e.message, /'pattern' at #\/properties\/id/);
    assert.match(e.message, /'oneOf' at #\/properties\/v/);
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }],
    tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object', properties: { a: { type: 'string', pattern: 'x' } } } } }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools' && /pattern/.test(e.message));
});
