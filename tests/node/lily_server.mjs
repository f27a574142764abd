// Shared by the Node suites: a tiny synthetic checkpoint (random weights, real Qwen3 tokenizer
// and chat template) and `lily serve` processes over it, on a free port.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const LILY = process.env.LILY_BIN;
export const MODEL = 'Qwen3.6-35B-A3B';
export const skipReason = !LILY ? 'LILY_BIN is not set: build lily and set LILY_BIN=<path>' : false;

// A fresh tiny checkpoint in a temporary directory.
export function synthCheckpoint(seed = 1) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lily-node-'));
  const r = spawnSync(LILY, ['synth', '--preset', 'tiny', '--seed', String(seed), '--out', dir], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`lily synth failed: ${r.stderr}`);
  return dir;
}

// Starts `lily serve --model dir --port 0 ...args` and waits until /health answers.
export async function startServer(dir, args = []) {
  const proc = spawn(LILY, ['serve', '--model', dir, '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on [^:\s]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`lily serve exited (${code}): ${stderr}`)));
    setTimeout(() => reject(new Error(`lily serve did not start: ${stderr}`)), 120000).unref();
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${base}/health`)).ok) break;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { proc, base, port, exited, stderr: () => stderr };
}

export async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return Number(line.split(' ')[1]);
}

export async function waitIdle(base) {
  for (let i = 0; i < 400; i++) {
    const h = await (await fetch(`${base}/health`)).json();
    if (!h.busy && h.queue_depth === 0) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('engine did not become idle');
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
