#!/usr/bin/env node
// The cost of structured outputs under load: the same streaming load (bench/load.mjs) run plain
// and with a response_format json_schema, at 1 and at 16 clients, against a running `lily serve`.
// Thinking is off in both, so every token of a constrained reply is masked. Prints the aggregate
// tok/s and per-stream time per output token of each pair, their ratio, and the mean time of one
// token mask (from /metrics: lily_structured_mask_seconds_total / lily_structured_masks_total).
//
//   node bench/structured_overhead.mjs --url http://127.0.0.1:8080 [--max-tokens 128] [--requests 8]
import { runLoad, metric } from './load.mjs';

const args = process.argv.slice(2);
const get = (k, d) => { const i = args.indexOf(`--${k}`); return i >= 0 ? args[i + 1] : d; };
const url = get('url', 'http://127.0.0.1:8080');
const maxTokens = Number(get('max-tokens', 128));
const perClient = Number(get('requests', 4));

// Strings (the bulk of most JSON) and structure: objects, arrays, numbers, enums.
const schema = {
  type: 'object', additionalProperties: false, required: ['title', 'items', 'notes'],
  properties: {
    title: { type: 'string', maxLength: 60 },
    items: { type: 'array', maxItems: 8, items: { type: 'object', additionalProperties: false, required: ['name', 'qty', 'unit', 'price'],
             properties: { name: { type: 'string', maxLength: 30 }, qty: { type: 'integer', minimum: 1, maximum: 1000 },
                           unit: { enum: ['kg', 'g', 'l', 'ml', 'piece'] }, price: { type: 'number', minimum: 0 } } } },
    notes: { type: 'string' },
  },
};

const plain = { chat_template_kwargs: { enable_thinking: false } };
const constrained = { ...plain, response_format: { type: 'json_schema', json_schema: { name: 'order', strict: true, schema } } };

const rows = [];
for (const clients of [1, 16]) {
  const pair = {};
  for (const [name, extra] of [['plain', plain], ['json_schema', constrained]]) {
    const m0 = (await metric(url, 'lily_structured_masks_total')) ?? 0, s0 = (await metric(url, 'lily_structured_mask_seconds_total')) ?? 0;
    const r = await runLoad({ url, clients, requests: clients * perClient, maxTokens, extra, seed: 7 });
    const m1 = (await metric(url, 'lily_structured_masks_total')) ?? 0, s1 = (await metric(url, 'lily_structured_mask_seconds_total')) ?? 0;
    if (r.failed.length) throw new Error(`${name} at ${clients} clients: ${JSON.stringify(r.failed)}`);
    pair[name] = { tok_s: r.aggregate_tok_s, tpot_ms: r.tpot_ms.p50, tokens: r.completion_tokens,
                   mask_ms: m1 > m0 ? ((s1 - s0) / (m1 - m0)) * 1e3 : null, masks: m1 - m0 };
  }
  rows.push({ clients, ...pair, throughput_ratio: Math.round((pair.json_schema.tok_s / pair.plain.tok_s) * 1000) / 1000 });
}
console.log('| clients | plain tok/s | json_schema tok/s | ratio | plain TPOT p50 ms | json_schema TPOT p50 ms | mean mask ms | masks |');
console.log('|---|---|---|---|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.clients} | ${r.plain.tok_s} | ${r.json_schema.tok_s} | ${r.throughput_ratio} | ${r.plain.tpot_ms} | ` +
              `${r.json_schema.tpot_ms} | ${r.json_schema.mask_ms?.toFixed(3)} | ${r.json_schema.masks} |`);
console.log(JSON.stringify(rows));
