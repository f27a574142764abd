// Soak test of continuous batching on the tiny checkpoint: 200 requests from 16 concurrent
// clients (streamed and not, follow-up turns that hit the prefix cache, random disconnects).
// Every request must be answered or cancelled cleanly, the server must drain to zero running
// requests, and its resident memory must come back to the level measured after a warm-up of the
// same shape. Bounded: about a minute on a 2-core machine.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';

import { runLoad, metric } from '../../bench/load.mjs';
import { skipReason, synthCheckpoint, startServer } from './lily_server.mjs';

const skip = skipReason;
if (skip) console.error(`SKIP soak test: ${skip}`);

let dir, server, base;

test.before(async () => {
  if (skip) return;
  dir = synthCheckpoint(4);
  server = await startServer(dir, ['--parallel', '16', '--max-queue', '64', '--max-seq', '512', '--max-cached', '64']);
  base = server.base;
});

test.after(async () => {
  if (server && server.proc.exitCode === null) {
    const t = Date.now();
    server.proc.kill('SIGTERM');
    await server.exited;
    console.log(`server exited ${((Date.now() - t) / 1000).toFixed(1)} s after SIGTERM`);
  }
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

async function drained() {
  for (let i = 0; i < 100; i++) {
    if ((await metric(base, 'lily_requests_running')) === 0 && (await metric(base, 'lily_queue_depth')) === 0) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

test('200 requests from 16 clients with disconnects: all answered or cancelled, memory back to baseline', { skip, timeout: 600000 },
  async () => {
    const shape = { url: base, clients: 16, maxTokens: 24, promptWords: 40, followUps: 1, disconnect: 0.2, nonStream: 0.2 };
    const t0 = Date.now();
    const log = (what) => console.log(`[soak +${((Date.now() - t0) / 1000).toFixed(1)} s] ${what}`);
    const warm = await runLoad({ ...shape, requests: 48, seed: 1 });
    log('warm-up done');
    assert.deepEqual(warm.failed, []);
    assert.ok(await drained(), 'requests still running after the warm-up');
    const rss0 = await metric(base, 'process_resident_memory_bytes');
    assert.ok(rss0 > 0);

    const rep = await runLoad({ ...shape, requests: 200, seed: 2 });
    log('200 requests done');
    const { results, ...summary } = rep;
    console.log(JSON.stringify(summary));
    assert.equal(results.length, 200);
    assert.deepEqual(rep.failed, [], 'every request gets a 200 or is cancelled by its client');
    for (const r of results.filter((x) => !x.aborted))
      assert.ok(['stop', 'length'].includes(r.finish), `request ${r.id} ended with ${r.finish}`);
    assert.ok(rep.aborted >= 10, `expected random disconnects, got ${rep.aborted}`);
    assert.ok(rep.completed + rep.aborted === 200);
    assert.ok(rep.cache_hit_rate > 0, 'follow-up turns hit the prefix cache');
    assert.ok(await drained(), 'disconnected requests must leave the batch');
    log('drained');
    const steps = await metric(base, 'lily_decode_steps_total');
    const rows = await metric(base, 'lily_decode_rows_total');
    assert.ok(rows / steps > 2, `requests decoded together (mean batch ${rows / steps})`);
    const rss1 = await metric(base, 'process_resident_memory_bytes');
    console.log(`resident memory: ${(rss0 / 2 ** 20).toFixed(1)} MiB after warm-up, ${(rss1 / 2 ** 20).toFixed(1)} MiB after the soak`);
    assert.ok(rss1 <= rss0 * 1.1 + 32 * 2 ** 20, `memory grew from ${rss0} to ${rss1}`);
    assert.equal((await fetch(`${base}/health`)).status, 200);
  });
