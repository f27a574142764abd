#!/usr/bin/env node
// Side-by-side CPU benchmark: `lily bench-cpu` against llama.cpp (the prebuilt CPU binary of the
// npm package node-llama-cpp 3.22.1) on the same machine, the same weights at the same bits per
// weight (a GGUF that `lily gguf` writes from the checkpoint: Q4_0 = 4.5 bits like MLX's 4-bit),
// the same prompt (lily's bench contract: token i = (i·2654435761 mod 2^32) mod vocab), the same
// number of threads and the same measurement: prefill = the prompt through to the first greedy
// token; decode = the next 64 greedy tokens, one per step.
//
//   node bench/vs_llama.mjs --model DIR [--lily build/lily] [--threads 2] [--rounds 3]
//        [--prompt-len 256] [--decode 64] [--type q4_0|q4_1] [--gguf FILE] [--warm-runs 1] [--json out.json]
//
// Each run is a fresh process that loads its file and warms up in-process on the same prompt
// shape before the timed part (lily bench-cpu does; the llama.cpp worker below does the same).
// Before the rounds each engine runs --warm-runs times untimed so its file is in the page cache;
// then the rounds alternate the engines (lily first in even rounds, llama.cpp first in odd ones).
// The table gives medians over the rounds and lily/llama.cpp ratios. Machines differ: compare
// the ratio of one run, not absolute numbers across machines.
//
// First use: node-llama-cpp 3.22.1 and its linux-x64 CPU binaries (about 85 MB) are installed with
// npm into <dir of the lily binary>/vs_llama/, and the GGUF is written next to the checkpoint
// (DIR/lily-q4_0.gguf), then reused while it is newer than the checkpoint's weights.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const NLC_VERSION = '3.22.1';
const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');

function parseArgs(argv) {
  const a = { lily: path.join(repo, 'build', 'lily'), threads: 2, rounds: 3, promptLen: 256, decode: 64, type: 'q4_0',
    warmRuns: 1, bwGib: 0.5 };
  const names = { '--model': 'model', '--lily': 'lily', '--threads': 'threads', '--rounds': 'rounds',
    '--prompt-len': 'promptLen', '--decode': 'decode', '--type': 'type', '--gguf': 'gguf', '--json': 'json',
    '--warm-runs': 'warmRuns', '--bw-gib': 'bwGib', '--vocab': 'vocab' };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--worker') { a.worker = true; continue; }
    const k = names[argv[i]];
    if (!k || i + 1 >= argv.length) throw new Error(`unknown or incomplete option ${argv[i]} (see the header of ${path.basename(fileURLToPath(import.meta.url))})`);
    const v = argv[++i];
    a[k] = ['model', 'lily', 'type', 'gguf', 'json'].includes(k) ? v : Number(v);
  }
  return a;
}

// lily's bench prompt (cmd_bench_cpu.cpp).
function benchPrompt(n, vocab) {
  return Array.from({ length: n }, (_, i) => Number((BigInt(i) * 2654435761n % (1n << 32n)) % BigInt(vocab)));
}

// ---- the llama.cpp side: a worker process ------------------------------------------------------
async function llamaWorker(a) {
  const req = createRequire(path.join(a.cache, 'package.json'));
  const { getLlama, LlamaLogLevel } = await import(req.resolve('node-llama-cpp'));
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.warn, maxThreads: a.threads });
  const t0 = performance.now();
  const model = await llama.loadModel({ modelPath: a.gguf, gpuLayers: 0 });
  const loadS = (performance.now() - t0) / 1e3;
  const ctx = await model.createContext({ contextSize: a.promptLen + a.decode + 16, batchSize: Math.max(512, a.promptLen),
    threads: a.threads });
  const seq = ctx.getSequence({ checkpoints: { interval: false } });
  const prompt = benchPrompt(a.promptLen, a.vocab);
  const opts = { temperature: 0, yieldEogToken: true };
  // Warm-up: the same prompt shape, prefill + one decode step (as lily bench-cpu does).
  { const g = seq.evaluate(prompt, opts); await g.next(); await g.next(); await g.return(); }
  await seq.clearHistory();
  // CPU seconds of this process (all its threads) over the wall time of the pool: the share of
  // the cores it got, as lily bench-cpu reports it.
  const share = (c, s) => { const u = process.cpuUsage(c); return (u.user + u.system) / 1e6 / (s * a.threads); };
  const gen = seq.evaluate(prompt, opts);
  const c0 = process.cpuUsage(), p0 = performance.now();
  const ids = [(await gen.next()).value];
  const prefillS = (performance.now() - p0) / 1e3, prefillShare = share(c0, prefillS);
  const c1 = process.cpuUsage(), d0 = performance.now();
  for (let i = 0; i < a.decode; ++i) ids.push((await gen.next()).value);
  const decodeS = (performance.now() - d0) / 1e3, decodeShare = share(c1, decodeS);
  await gen.return();
  process.stdout.write(JSON.stringify({ load_s: loadS, prefill_tok_s: a.promptLen / prefillS, decode_tok_s: a.decode / decodeS,
    token_ids: ids, cpu_share: [prefillShare, decodeShare], cpu_math_cores: llama.cpuMathCores }) + '\n');
  await model.dispose();
}

// ---- the driver ------------------------------------------------------------------------------
function ensureNodeLlamaCpp(cache) {
  const pkg = path.join(cache, 'node_modules', 'node-llama-cpp', 'package.json');
  if (fs.existsSync(pkg) && JSON.parse(fs.readFileSync(pkg, 'utf8')).version === NLC_VERSION) return;
  console.error(`vs_llama: installing node-llama-cpp ${NLC_VERSION} (prebuilt CPU binaries, ~85 MB) into ${cache} (first use)`);
  fs.mkdirSync(cache, { recursive: true });
  fs.writeFileSync(path.join(cache, 'package.json'), JSON.stringify({ private: true, name: 'lily-vs-llama-cache' }) + '\n');
  // Only the CPU package: the CUDA/Vulkan optional ones are large and unused here.
  const r = spawnSync('npm', ['install', '--no-audit', '--no-fund', '--omit=optional', '--ignore-scripts',
    `node-llama-cpp@${NLC_VERSION}`, `@node-llama-cpp/linux-x64@${NLC_VERSION}`], { cwd: cache, stdio: 'inherit' });
  if (r.status !== 0) throw new Error('npm install of node-llama-cpp failed');
}

function ensureGguf(a) {
  const weights = path.join(a.model, 'model.safetensors');
  const fresh = fs.existsSync(a.gguf) && (!fs.existsSync(weights) || fs.statSync(a.gguf).mtimeMs > fs.statSync(weights).mtimeMs);
  if (fresh) return null;
  console.error(`vs_llama: writing ${a.gguf} with lily gguf (once; reused while newer than the checkpoint)`);
  const t0 = performance.now();
  const r = spawnSync(a.lily, ['gguf', '--model', a.model, '--out', a.gguf, '--type', a.type], { stdio: 'inherit' });
  if (r.status !== 0) throw new Error('lily gguf failed');
  return (performance.now() - t0) / 1e3;
}

// Runs a command; resolves {stdout, peak_rss_gib (VmHWM polled every 200 ms), wall_s}.
function run(cmd, args) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '', hwm = 0;
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    const poll = setInterval(() => {
      try {
        const m = fs.readFileSync(`/proc/${p.pid}/status`, 'utf8').match(/VmHWM:\s+(\d+) kB/);
        if (m) hwm = Math.max(hwm, Number(m[1]));
      } catch { /* exited */ }
    }, 200);
    p.on('close', (code) => {
      clearInterval(poll);
      if (code !== 0) return reject(new Error(`${cmd} ${args.join(' ')} exited ${code}:\n${err.slice(-4000)}`));
      resolve({ stdout: out, peak_rss_gib: hwm / 1048576, wall_s: (performance.now() - t0) / 1e3 });
    });
  });
}

async function runLily(a) {
  const tmp = path.join(os.tmpdir(), `vs_llama_lily_${process.pid}.json`);
  const r = await run(a.lily, ['bench-cpu', '--model', a.model, '--threads', String(a.threads), '--prompt-len', String(a.promptLen),
    '--decode', String(a.decode), '--bw-gib', String(a.bwGib), '--json', tmp]);
  const j = JSON.parse(fs.readFileSync(tmp, 'utf8'));
  fs.rmSync(tmp, { force: true });
  return { prefill_tok_s: j.prefill_tok_s, decode_tok_s: j.decode_tok_s, token_ids: j.token_ids, load_s: j.load_s,
    cpu_share: [j.prefill_cpu_share, j.decode_cpu_share], peak_rss_gib: r.peak_rss_gib, wall_s: r.wall_s };
}

async function runLlama(a) {
  const r = await run(process.execPath, [fileURLToPath(import.meta.url), '--worker', '--gguf', a.gguf, '--threads', String(a.threads),
    '--prompt-len', String(a.promptLen), '--decode', String(a.decode), '--vocab', String(a.vocab), '--lily', a.lily]);
  const line = r.stdout.trim().split('\n').pop();
  return { ...JSON.parse(line), peak_rss_gib: r.peak_rss_gib, wall_s: r.wall_s };
}

const median = (xs) => { const s = [...xs].sort((x, y) => x - y); return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
const f = (x, d = 2) => x.toFixed(d);

function machine() {
  const cpu = (fs.readFileSync('/proc/cpuinfo', 'utf8').match(/model name\s*:\s*(.*)/) || [])[1] ?? os.cpus()[0]?.model;
  const git = spawnSync('git', ['-C', repo, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).stdout.trim();
  const dirty = spawnSync('git', ['-C', repo, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' }).stdout.trim() ? ' (dirty)' : '';
  return `${cpu}, ${os.cpus().length} logical CPUs, ${f(os.totalmem() / 2 ** 30, 1)} GiB RAM; lily commit ${git}${dirty}`;
}

function agreement(x, y) {
  let k = 0;
  while (k < x.length && k < y.length && x[k] === y[k]) ++k;
  return k;
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  a.cache = path.join(path.dirname(path.resolve(a.lily)), 'vs_llama');
  if (a.worker) return llamaWorker(a);
  if (!a.model) throw new Error('--model DIR is required');
  a.gguf ??= path.join(a.model, `lily-${a.type}.gguf`);
  a.vocab = JSON.parse(fs.readFileSync(path.join(a.model, 'config.json'), 'utf8')).text_config.vocab_size;
  ensureNodeLlamaCpp(a.cache);
  const ggufS = ensureGguf(a);
  const engines = { lily: runLily, llama: runLlama };
  const t0 = performance.now();
  for (let w = 0; w < a.warmRuns; ++w)
    for (const e of ['lily', 'llama']) { console.error(`vs_llama: warm-up run of ${e} (untimed)`); await engines[e](a); }
  const res = { lily: [], llama: [] };
  for (let r = 0; r < a.rounds; ++r) {
    for (const e of r % 2 === 0 ? ['lily', 'llama'] : ['llama', 'lily']) {
      const x = await engines[e](a);
      res[e].push(x);
      console.error(`vs_llama: round ${r + 1}/${a.rounds} ${e}: prefill ${f(x.prefill_tok_s)} tok/s, decode ${f(x.decode_tok_s)} tok/s, ` +
        `peak RSS ${f(x.peak_rss_gib)} GiB, ${f(x.wall_s, 1)} s`);
    }
  }
  const med = (e, k) => median(res[e].map((x) => x[k]));
  const runs = (e, k) => res[e].map((x) => f(x[k])).join(' / ');
  const shares = (e) => [0, 1].map((k) => `${f(100 * median(res[e].map((x) => x.cpu_share[k])), 0)}%`).join(' / ');
  const agree = median(res.llama.map((x, i) => agreement(x.token_ids, res.lily[i].token_ids)));
  const ggufGb = fs.statSync(a.gguf).size / 1e9, mlxGb = fs.statSync(path.join(a.model, 'model.safetensors')).size / 1e9;
  const lines = [
    `machine: ${machine()}; ${a.threads} threads, prompt ${a.promptLen} tokens, ${a.decode} decode steps, ${a.rounds} rounds`,
    `files: ${a.model}/model.safetensors ${f(mlxGb)} GB (MLX 4-bit) vs ${a.gguf} ${f(ggufGb)} GB (${a.type.toUpperCase()})`,
    '',
    `| engine | prefill tok/s (median) | decode tok/s (median) | prefill runs | decode runs | CPU share prefill / decode | peak RSS GiB |`,
    `|---|---:|---:|---|---|---:|---:|`,
    `| lily bench-cpu | ${f(med('lily', 'prefill_tok_s'))} | ${f(med('lily', 'decode_tok_s'))} | ${runs('lily', 'prefill_tok_s')} | ${runs('lily', 'decode_tok_s')} | ${shares('lily')} | ${f(med('lily', 'peak_rss_gib'))} |`,
    `| llama.cpp (node-llama-cpp ${NLC_VERSION}, ${a.type.toUpperCase()}) | ${f(med('llama', 'prefill_tok_s'))} | ${f(med('llama', 'decode_tok_s'))} | ${runs('llama', 'prefill_tok_s')} | ${runs('llama', 'decode_tok_s')} | ${shares('llama')} | ${f(med('llama', 'peak_rss_gib'))} |`,
    `| **lily / llama.cpp** | **${f(med('lily', 'prefill_tok_s') / med('llama', 'prefill_tok_s'))}×** | **${f(med('lily', 'decode_tok_s') / med('llama', 'decode_tok_s'))}×** | | | | |`,
    '',
    `CPU share: CPU seconds of the process over wall time × threads (low: other work took cores, or threads waited). ` +
      `Peak RSS counts the mapped file pages too; llama.cpp also holds a repacked copy of the weights.`,
    `greedy tokens: llama.cpp's first ${agree} of ${a.decode + 1} equal lily's (median over rounds)`,
    `time: ${ggufS == null ? 'GGUF reused' : `GGUF written in ${f(ggufS, 1)} s`}; benchmark ${f((performance.now() - t0) / 1e3, 1)} s`,
  ];
  console.log(lines.join('\n'));
  if (a.json) fs.writeFileSync(a.json, JSON.stringify({ args: a, machine: machine(), results: res }, null, 2) + '\n');
}

main().catch((e) => { console.error(`vs_llama: ${e.message}`); process.exit(1); });
