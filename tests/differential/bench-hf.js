#!/usr/bin/env node
// Encode-throughput benchmark of the Hugging Face tokenizers binding (@anush008/tokenizers) for
// scripts/bench-tokenizer.sh: encodes the whole file repeatedly for S seconds, one call at a time.
// usage: node bench-hf.js TOKENIZER_JSON TEXT_FILE SECONDS   -> prints one JSON line
'use strict';
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');
(async () => {
  const [tjson, file, secs] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tjson);
  const text = fs.readFileSync(file, 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  let tokens = (await tok.encode(text, null, { addSpecialTokens: false })).getIds().length;  // warm-up
  let iters = 0;
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  let wall = 0;
  do {
    tokens = (await tok.encode(text, null, { addSpecialTokens: false })).getIds().length;
    iters++;
    wall = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (wall < Number(secs));
  const c = process.cpuUsage(c0);
  const cpu = (c.user + c.system) / 1e6;
  const mb = bytes / 1e6;
  console.log(JSON.stringify({ bytes, tokens, iterations: iters, seconds: wall, cpu_seconds: cpu,
    mb_per_s: mb * iters / wall, mb_per_cpu_s: mb * iters / cpu }));
})();
