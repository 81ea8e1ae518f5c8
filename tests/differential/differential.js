#!/usr/bin/env node
// Differential test: nf4flash's tokenizer against the Hugging Face tokenizers library (Rust, via
// the @anush008/tokenizers Node binding). Generates random strings with a fixed seed (mixed
// scripts, whitespace runs, digits, emoji, special-token look-alikes; no lone surrogates),
// encodes them with both for llama3, qwen3 and llama2 and requires identical ids (with and
// without special tokens) and identical decoded text.
//
// usage: node differential.js --bin BUILD/nf4flash --fixtures DIR [--count N] [--seed S]
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

function arg(name, def) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : def;
}
const bin = arg('--bin');
const fixtures = arg('--fixtures');
const count = parseInt(arg('--count', '3000'), 10);
const seed = parseInt(arg('--seed', '20261202'), 10);
const names = (arg('--tokenizers', 'llama3,qwen3,llama2')).split(',');
if (!bin || !fixtures) {
  console.error('usage: node differential.js --bin NF4FLASH --fixtures DIR [--count N] [--seed S]');
  process.exit(2);
}

let HF;
try {
  HF = require('@anush008/tokenizers');
} catch (e) {
  console.log('SKIP: @anush008/tokenizers is not installed (run npm ci in tests/differential)');
  process.exit(77);
}

// mulberry32: small seeded PRNG.
let state = seed >>> 0;
function rnd() {
  state = (state + 0x6D2B79F5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (a, b) => a + Math.floor(rnd() * (b - a + 1));
const pick = (arr) => arr[Math.floor(rnd() * arr.length)];
const cps = (lo, hi, n) => {
  let s = '';
  for (let i = 0; i < n; i++) s += String.fromCodePoint(ri(lo, hi));
  return s;
};

const WORDS = ['the', 'Hello', 'world', 'LLM', 'tokenizer', 'quantization', 'FlashAttention', 'GPU', 'don\'t',
  'I\'m', 'we\'LL', 'they\'VE', 'it\'s', 'O\'Neil', 'x', 'naïve', 'café', 'Ångström', 'résumé', 'snake_case',
  'camelCase', 'https://example.com/a?b=1&c=2', 'user@example.org', 'C++', 'std::vector<int>', '1e-4'];
const SPECIAL = ['<|eot_id|>', '<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>', '<|end_header_id|>',
  '<|reserved_special_token_5|>', '<s>', '</s>', '<unk>', '<|im_start|>', '<|im_end|>', '<|endoftext|>',
  '<think>', '</think>', '<tool_call>', '<|eot', 'eot_id|>', '<|im_start', '< s>', '<<s>>', '<0x0A>', '▁', '▁▁x',
  '<|fim_prefix|>', '<|vision_pad|>'];
const SPACES = [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '\n ', ' \t ', '\u00a0', '\u3000', '\u2003',
  '    ', '\n\n\n', ' \r\n\r\n  ', '\u200b', '\u2028'];
const PUNCT = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~…—–«»“”‘’・、。，：！？'.split('');
const EMOJI = ['🙂', '🚀', '👩‍💻', '🇰🇷', '🇯🇵', '❤️', '👍🏽', '🤖', '😀😀', '🧑‍🤝‍🧑', '✨', '©', '™', '𝔘𝔫𝔦'];

function fragment() {
  switch (ri(0, 17)) {
    case 0: return pick(WORDS);
    case 1: return cps(0x61, 0x7a, ri(1, 10));                       // ASCII lower
    case 2: return cps(0x41, 0x5a, ri(1, 6));                        // ASCII upper
    case 3: return cps(0xac00, 0xd7a3, ri(1, 6));                    // Hangul syllables
    case 4: return cps(0x4e00, 0x9fff, ri(1, 8));                    // CJK
    case 5: return cps(0x3041, 0x3096, ri(1, 5)) + cps(0x30a1, 0x30fa, ri(0, 4)); // kana
    case 6: return cps(0x0410, 0x044f, ri(1, 9));                    // Cyrillic
    case 7: return cps(0x0621, 0x064a, ri(1, 8));                    // Arabic
    case 8: return String(ri(0, 10 ** ri(1, 9)));                    // digits
    case 9: return pick(SPACES);
    case 10: return pick(SPECIAL);
    case 11: return pick(PUNCT) + (rnd() < 0.3 ? pick(PUNCT) : '');
    case 12: return pick(EMOJI);
    case 13: return cps(0x0391, 0x03c9, ri(1, 6));                   // Greek
    case 14: return pick(['e\u0301', 'a\u0308', 'n\u0303', '\u1100\u1161\u11a8', '\u1112\u1161', 'A\u030a',
                          'o\u0302\u0323', '\u0301', 'ﬁ', 'Ǆ', '½', '²', '٣', 'Ⅻ']);  // NFC material
    case 15: return pick(['\'s', '\'S', '\'t', '\'re', '\'VE', '\'m', '\'ll', '\'D', '\'ſ', '\'x']);
    case 16: return cps(0x00c0, 0x024f, ri(1, 4));                   // Latin-1 / Extended
    default: return cps(0x20, 0x7e, ri(1, 12));                      // printable ASCII soup
  }
}

function randomString() {
  const n = ri(1, 14);
  let s = '';
  for (let i = 0; i < n; i++) {
    s += fragment();
    if (rnd() < 0.5) s += ' ';
  }
  return s;
}

function eq(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

(async () => {
  const texts = [];
  for (let i = 0; i < count; i++) texts.push(randomString());
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'nf4flash-diff-'));
  const input = path.join(tmp, 'texts.json');
  fs.writeFileSync(input, JSON.stringify(texts));
  let failures = 0, compared = 0;
  for (const name of names) {
    const tjson = path.join(fixtures, 'tokenizers', name, 'tokenizer.json');
    const hf = HF.Tokenizer.fromFile(tjson);
    const ours = JSON.parse(execFileSync(bin, ['tokenize', '--tokenizer', tjson, '--batch-file', input],
      { maxBuffer: 1 << 30, encoding: 'utf8' }));
    let bad = 0;
    for (let i = 0; i < texts.length; i++) {
      const e = await hf.encode(texts[i], null, { addSpecialTokens: false });
      const es = await hf.encode(texts[i], null, { addSpecialTokens: true });
      const ids = e.getIds(), idsS = es.getIds();
      const dec = await hf.decode(ids, false);
      const problems = [];
      if (!eq(ids, ours.ids[i])) problems.push(`ids hf=${JSON.stringify(ids)} ours=${JSON.stringify(ours.ids[i])}`);
      if (!eq(idsS, ours.ids_with_special[i])) problems.push('ids_with_special differ');
      if (dec !== ours.decoded[i]) problems.push(`decoded hf=${JSON.stringify(dec)} ours=${JSON.stringify(ours.decoded[i])}`);
      compared++;
      if (problems.length) {
        bad++;
        if (bad <= 8) console.log(`MISMATCH ${name} #${i} ${JSON.stringify(texts[i])}\n  ${problems.join('\n  ')}`);
      }
    }
    console.log(`${name}: ${texts.length} strings compared, ${bad} mismatches`);
    failures += bad;
  }
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log(`differential: ${compared} encodings compared (${count} strings x ${names.length} tokenizers, seed ${seed}), ${failures} mismatches`);
  process.exit(failures ? 1 : 0);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
