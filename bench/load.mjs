#!/usr/bin/env node
// Load generator for `lily serve`: N concurrent clients stream chat completions over HTTP and it
// reports aggregate decode tok/s, time to first token, inter-token latency percentiles (per SSE
// event, as vLLM's benchmark does: an event can carry several tokens when a token completes no
// text) and time per output token (per request: (last event - first) / (tokens - 1), the
// stream's decode rate), the prefix-cache hit rate (from /metrics) and every failure. Also used
// by the soak test.
//
//   node bench/load.mjs --url http://127.0.0.1:8080 --clients 16 --requests 64 --max-tokens 128 [--json out.json]
//   options: --prompt-words N (default 48), --follow-ups K (each client continues its own
//   conversation K times, so later turns hit the prefix cache), --disconnect P (abort a streamed
//   reply after a random number of tokens with probability P), --non-stream P, --seed S,
//   --system-words N (a system prompt of N words shared by every conversation), --logprobs (ask for
//   logprobs: each event then names its tokens, and itl_token_ms gives every token its share of
//   its event's interval, so an event that carries several tokens counts as several intervals).
import fs from 'node:fs';

export function percentile(xs, p) {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

function lcg(seed) {
  let x = BigInt(seed) & 0xffffffffn;
  return () => {
    x = (x * 1103515245n + 12345n) & 0x7fffffffn;
    return Number(x) / 0x80000000;
  };
}

const WORDS = ('alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa ' +
  'quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud lamp paper green orange').split(' ');

export async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : null;
}

// One streamed (or not) chat completion. Returns {status, tokens, ttft, itl[], finish, aborted, error}.
async function one(base, body, { abortAfter = -1, stream = true, apiKey } = {}) {
  const ctl = new AbortController();
  const t0 = performance.now();
  const out = { status: 0, tokens: 0, ttft: null, itl: [], itl_tok: [], tpot: null, finish: null, aborted: false, error: null, text: '' };
  let first = null, end = null;
  try {
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', signal: ctl.signal,
      headers: { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
      body: JSON.stringify({ ...body, stream, ...(stream ? { stream_options: { include_usage: true } } : {}) }),
    });
    out.status = r.status;
    if (!stream || r.status !== 200) {
      const j = await r.json();
      if (r.status !== 200) { out.error = j.error?.message ?? `status ${r.status}`; return out; }
      out.finish = j.choices[0].finish_reason;
      out.tokens = j.usage.completion_tokens;
      out.ttft = performance.now() - t0;
      return out;
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '', last = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: ')) continue;
        const data = ev.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) { out.error = j.error.message; continue; }
        if (j.usage) out.usage = j.usage;
        const ch = j.choices?.[0];
        if (!ch) continue;
        const piece = (ch.delta?.content ?? '') + (ch.delta?.reasoning_content ?? '');
        const n = ch.logprobs?.content?.length ?? 0;  // tokens in this event (when logprobs were asked for)
        if (piece.length > 0 || ch.delta?.tool_calls || n > 0) {
          const now = performance.now();
          if (out.ttft === null) out.ttft = now - t0, first = now;
          else {
            out.itl.push(now - last);
            for (let i = 0; i < n; ++i) out.itl_tok.push((now - last) / n);
          }
          last = now;
          out.text += piece;
        }
        if (ch.finish_reason) out.finish = ch.finish_reason, end = performance.now();
        if (abortAfter >= 0 && out.itl.length + (out.ttft !== null ? 1 : 0) >= abortAfter) {
          out.aborted = true;
          ctl.abort();
          return out;
        }
      }
    }
    out.tokens = out.usage?.completion_tokens ?? 0;
    if (first !== null && end !== null && out.tokens >= 2) out.tpot = (end - first) / (out.tokens - 1);
  } catch (e) {
    if (out.aborted || e.name === 'AbortError') out.aborted = true;
    else out.error = String(e);
  }
  return out;
}

export async function runLoad(o) {
  const opt = { clients: 16, requests: 64, maxTokens: 64, promptWords: 48, followUps: 0, disconnect: 0,
                nonStream: 0, seed: 1, systemWords: 0, model: 'Qwen3.6-35B-A3B', extra: {}, ...o };
  const rand = lcg(opt.seed);
  const system = Array.from({ length: opt.systemWords }, (_, i) => WORDS[(i * 7 + 3) % WORDS.length]).join(' ');
  const hits0 = (await metric(opt.url, 'lily_prefix_cache_hits_total')) ?? 0;
  const miss0 = (await metric(opt.url, 'lily_prefix_cache_misses_total')) ?? 0;
  const results = [];
  let next = 0;
  const t0 = performance.now();
  async function client(c) {
    let history = [];
    while (next < opt.requests) {
      const id = next++;
      if (history.length === 0 || history.length > 2 * (opt.followUps + 1) - 1) {
        const words = Array.from({ length: opt.promptWords }, () => WORDS[Math.floor(rand() * WORDS.length)]);
        history = [...(system ? [{ role: 'system', content: system }] : []),
                   { role: 'user', content: `Client ${c} request ${id}: ${words.join(' ')}` }];
      }
      const stream = rand() >= opt.nonStream;
      const abortAfter = stream && rand() < opt.disconnect ? 1 + Math.floor(rand() * 8) : -1;
      const body = { model: opt.model, messages: history, max_tokens: opt.maxTokens, temperature: 0.7, seed: id, ...opt.extra };
      const r = await one(opt.url, body, { abortAfter, stream, apiKey: opt.apiKey });
      r.id = id;
      results.push(r);
      if (r.status === 200 && !r.aborted && opt.followUps > 0) {
        history = [...history, { role: 'assistant', content: r.text }, { role: 'user', content: `and then ${WORDS[id % WORDS.length]}?` }];
      } else history = [];
    }
  }
  await Promise.all(Array.from({ length: opt.clients }, (_, c) => client(c)));
  const wall = (performance.now() - t0) / 1000;
  const ok = results.filter((r) => r.status === 200 && !r.aborted && !r.error);
  const tokens = ok.reduce((a, r) => a + r.tokens, 0);
  const itl = ok.flatMap((r) => r.itl);
  const itlTok = ok.flatMap((r) => r.itl_tok);
  const ttft = ok.map((r) => r.ttft).filter((x) => x !== null);
  const tpot = ok.map((r) => r.tpot).filter((x) => x !== null);
  const hits = ((await metric(opt.url, 'lily_prefix_cache_hits_total')) ?? 0) - hits0;
  const miss = ((await metric(opt.url, 'lily_prefix_cache_misses_total')) ?? 0) - miss0;
  const round = (x) => (x === null ? null : Math.round(x * 100) / 100);
  return {
    clients: opt.clients, requests: results.length, completed: ok.length,
    aborted: results.filter((r) => r.aborted).length,
    failed: results.filter((r) => !r.aborted && (r.status !== 200 || r.error)).map((r) => ({ id: r.id, status: r.status, error: r.error })),
    wall_s: round(wall), completion_tokens: tokens, aggregate_tok_s: round(tokens / wall),
    ttft_ms: { p50: round(percentile(ttft, 50)), p90: round(percentile(ttft, 90)), p99: round(percentile(ttft, 99)) },
    itl_ms: { p50: round(percentile(itl, 50)), p90: round(percentile(itl, 90)), p99: round(percentile(itl, 99)) },
    ...(itlTok.length ? { itl_token_ms: { p50: round(percentile(itlTok, 50)), p90: round(percentile(itlTok, 90)), p99: round(percentile(itlTok, 99)) } } : {}),
    tpot_ms: { p50: round(percentile(tpot, 50)), p90: round(percentile(tpot, 90)), p99: round(percentile(tpot, 99)) },
    stream_tok_s_p50: tpot.length ? round(1000 / percentile(tpot, 50)) : null,
    cache_hit_rate: hits + miss > 0 ? round(hits / (hits + miss)) : null,
    results,
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const get = (k, d) => { const i = args.indexOf(`--${k}`); return i >= 0 ? args[i + 1] : d; };
  const url = get('url', 'http://127.0.0.1:8080');
  const rep = await runLoad({
    url, clients: Number(get('clients', 16)), requests: Number(get('requests', 64)), maxTokens: Number(get('max-tokens', 64)),
    promptWords: Number(get('prompt-words', 48)), followUps: Number(get('follow-ups', 0)), disconnect: Number(get('disconnect', 0)),
    nonStream: Number(get('non-stream', 0)), seed: Number(get('seed', 1)), apiKey: get('api-key', undefined),
    systemWords: Number(get('system-words', 0)),
    extra: args.includes('--logprobs') ? { logprobs: true, top_logprobs: 0 } : {},
  });
  const { results, ...summary } = rep;
  console.log(JSON.stringify(summary, null, 2));
  const j = get('json', null);
  if (j) fs.writeFileSync(j, JSON.stringify(rep, null, 2));
  process.exit(summary.failed.length > 0 ? 1 : 0);
}
