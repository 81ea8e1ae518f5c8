// `nf4flash serve` driven by the official openai npm client, on the CPU with the llama2 fixture
// (a copy of it with a chat template added). Two servers on free loopback ports (--port 0, the
// port read from the start line), each stopped by its PID with SIGTERM (exit code 0 checked):
//   main:   models list; chat non-stream and stream (same text, greedy); completions both ways; logprobs;
//           usage in replies and in the last stream chunk; /tokenize and /detokenize; 8 concurrent
//           streams each equal to its solo reply; every bad request with its status (400 bad JSON,
//           missing/wrong fields, context; 401 key; 404 path; 413 body); a dropped stream and a
//           dropped non-stream request free their sequences; the same requests again give the same text; a second chat turn reuses the
//           first turn's KV blocks (metrics); /metrics in Prometheus text.
//   tight:  --max-batch 1 --max-waiting 1 --ignore-eos: a third concurrent request gets 429 with
//           Retry-After; SIGTERM while a stream runs lets it finish, then exit 0.
//   tp:     --tp 2 (rank 0 serves, one tp-worker process follows over TCP): the main server's first
//           reply, stream and not; 4 concurrent streams each equal to their solo reply; SIGTERM, exit 0.
// usage: node serve_openai.mjs NF4FLASH_BIN MODEL_DIR
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [bin, fixture] = process.argv.slice(2);
if (!bin || !fixture) {
  console.error('usage: node serve_openai.mjs NF4FLASH_BIN MODEL_DIR');
  process.exit(2);
}
const deadline = setTimeout(() => {
  console.error('FAIL: the test ran past its 240 s bound');
  process.exit(1);
}, 240_000);

// the fixture with a chat template (Llama-2 style)
const model = fs.mkdtempSync(path.join(os.tmpdir(), 'nf4flash-serve-'));
for (const f of fs.readdirSync(fixture)) fs.copyFileSync(path.join(fixture, f), path.join(model, f));
const tc = JSON.parse(fs.readFileSync(path.join(model, 'tokenizer_config.json'), 'utf8'));
tc.chat_template =
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>\\n{{ m['content'] }}\\n<</SYS>>\\n\\n" +
  "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %} {{ m['content'] }} {{ eos_token }}" +
  "{% endif %}{% endfor %}";
fs.writeFileSync(path.join(model, 'tokenizer_config.json'), JSON.stringify(tc));
const modelId = path.basename(model);

const children = [];
process.on('exit', () => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
  fs.rmSync(model, { recursive: true, force: true });
});

function start(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['serve', '--model', model, '--device', 'cpu', '-t', '2', '--port', '0', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    children.push(child);
    let err = '';
    const timer = setTimeout(() => reject(new Error('server did not start in 60 s:\n' + err)), 60_000);
    child.stderr.on('data', (d) => {
      err += d.toString();
      const m = err.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !child.port) {
        child.port = Number(m[1]);
        clearTimeout(timer);
        resolve(child);
      }
    });
    child.on('exit', (code) => {
      child.exitCode_ = code;
      if (!child.port) reject(new Error(`server exited (${code}) before listening:\n${err}`));
    });
    child.log = () => err;
  });
}

function stop(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve(child.exitCode);
    child.on('exit', (code) => resolve(code));
    child.kill('SIGTERM');
  });
}

let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`PASS ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const KEY = 'test-key-123';
const main = await start(['--api-key', KEY, '--max-batch', '4', '--ctx-size', '256', '--block-size', '8',
                          '--max-body-mb', '0.02']);
const base = `http://127.0.0.1:${main.port}`;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 });

const chatReq = (content, extra = {}) => ({
  model: modelId, messages: [{ role: 'user', content }], temperature: 0, max_tokens: 12, ...extra,
});
async function chatText(content, extra) {
  const r = await client.chat.completions.create(chatReq(content, extra));
  return r.choices[0].message.content;
}
async function streamText(content, extra = {}) {
  const s = await client.chat.completions.create({ ...chatReq(content, extra), stream: true });
  let text = '', finish = null;
  for await (const c of s) {
    if (c.choices.length) {
      text += c.choices[0].delta.content ?? '';
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
  }
  return { text, finish };
}

let first;
await check('models list', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, modelId);
});
await check('chat non-stream and stream give the same text', async () => {
  const r = await client.chat.completions.create(chatReq('Hello there, how are you?'));
  first = r.choices[0].message.content;
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 5 && r.usage.completion_tokens >= 1);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const s = await streamText('Hello there, how are you?');
  assert.equal(s.text, first);
  assert.equal(s.finish, r.choices[0].finish_reason);
});
await check('stream usage chunk', async () => {
  const s = await client.chat.completions.create({ ...chatReq('Count to three'), stream: true,
                                                   stream_options: { include_usage: true } });
  let usage = null;
  for await (const c of s) if (c.usage) usage = c.usage;
  assert.ok(usage && usage.completion_tokens >= 1 && usage.prompt_tokens > 0, JSON.stringify(usage));
});
await check('completions non-stream and stream', async () => {
  const r = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 10, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  const s = await client.completions.create({ model: modelId, prompt: 'Once upon a time', max_tokens: 10, temperature: 0,
                                              stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
  const ids = await client.completions.create({ model: modelId, prompt: [1, 450, 4996], max_tokens: 4, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
});
await check('stop strings cut the text', async () => {
  const full = await chatText('Tell me a story', { max_tokens: 20 });
  if (full.length < 4) return;  // nothing to cut
  const stop = full.slice(2, 4);
  const cut = await client.chat.completions.create(chatReq('Tell me a story', { max_tokens: 20, stop }));
  assert.equal(cut.choices[0].message.content, full.slice(0, full.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
  const st = await streamText('Tell me a story', { max_tokens: 20, stop: [stop] });
  assert.equal(st.text, full.slice(0, full.indexOf(stop)));
});
await check('logprobs: greedy picks the most likely token, one entry per token, stream and not', async () => {
  const r = await client.chat.completions.create(chatReq('Hello there', { max_tokens: 6, logprobs: true, top_logprobs: 3 }));
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    assert.ok(e.logprob <= 0 && e.top_logprobs.length === 3, JSON.stringify(e));
    assert.equal(e.top_logprobs[0].logprob, e.logprob);  // greedy
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
  }
  const s = await client.chat.completions.create({ ...chatReq('Hello there', { max_tokens: 6, logprobs: true, top_logprobs: 3 }),
                                                   stream: true });
  const streamed = [];
  for await (const c of s) if (c.choices.length && c.choices[0].logprobs) streamed.push(...c.choices[0].logprobs.content);
  assert.deepEqual(streamed.map((e) => e.logprob), content.map((e) => e.logprob));
  const cr = await client.completions.create({ model: modelId, prompt: 'Once upon', max_tokens: 4, temperature: 0, logprobs: 2 });
  assert.equal(cr.choices[0].logprobs.token_logprobs.length, cr.usage.completion_tokens);
  assert.equal(cr.choices[0].logprobs.top_logprobs[0] && Object.keys(cr.choices[0].logprobs.top_logprobs[0]).length <= 2, true);
});
await check('tokenize and detokenize', async () => {
  const h = { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` };
  const t = await (await fetch(`${base}/tokenize`, { method: 'POST', headers: h,
                                                     body: JSON.stringify({ content: 'Hello world' }) })).json();
  assert.ok(t.tokens.length >= 2);
  const d = await (await fetch(`${base}/detokenize`, { method: 'POST', headers: h,
                                                       body: JSON.stringify({ tokens: t.tokens.slice(1) }) })).json();
  assert.equal(d.content, 'Hello world');
});
await check('8 concurrent streams each equal their solo reply', async () => {
  const prompts = Array.from({ length: 8 }, (_, i) => `Question number ${i}: what is ${i} plus ${i * 3}?`);
  const solo = [];
  for (const p of prompts) solo.push(await chatText(p, { max_tokens: 16 }));
  const got = await Promise.all(prompts.map((p) => streamText(p, { max_tokens: 16 })));
  got.forEach((g, i) => assert.equal(g.text, solo[i], `stream ${i}`));
});

async function status(pathName, init = {}) {
  const r = await fetch(`${base}${pathName}`, init);
  const body = await r.text();
  return { status: r.status, body, json: (() => { try { return JSON.parse(body); } catch { return null; } })() };
}
const post = (body, key = KEY, route = '/v1/chat/completions') => ({
  method: 'POST', body, headers: { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) },
});
await check('bad requests get their status and OpenAI error JSON', async () => {
  const cases = [
    ['malformed JSON', '/v1/chat/completions', post('{"messages": [', KEY), 400],
    ['not an object', '/v1/chat/completions', post('[1,2]'), 400],
    ['missing messages', '/v1/chat/completions', post('{"model": "x"}'), 400],
    ['messages not an array', '/v1/chat/completions', post('{"messages": "hi"}'), 400],
    ['bad role', '/v1/chat/completions', post('{"messages": [{"role": "wizard", "content": "x"}]}'), 400],
    ['temperature a string', '/v1/chat/completions', post(JSON.stringify(chatReq('x', { temperature: 'hot' }))), 400],
    ['max_tokens negative', '/v1/chat/completions', post(JSON.stringify(chatReq('x', { max_tokens: -1 }))), 400],
    ['max_tokens past the context', '/v1/chat/completions', post(JSON.stringify(chatReq('x', { max_tokens: 100000 }))), 400],
    ['unknown field', '/v1/chat/completions', post(JSON.stringify(chatReq('x', { temprature: 0.5 }))), 400],
    ['top_p zero', '/v1/chat/completions', post(JSON.stringify(chatReq('x', { top_p: 0 }))), 400],
    ['completions without prompt', '/v1/completions', post('{"max_tokens": 3}'), 400],
    ['token id outside the vocabulary', '/v1/completions', post('{"prompt": [1, 99999999]}'), 400],
    ['wrong key', '/v1/chat/completions', post(JSON.stringify(chatReq('x')), 'nope'), 401],
    ['missing key', '/v1/models', { method: 'GET' }, 401],
    ['unknown path', '/v1/nothing', post('{}'), 404],
    ['body too large', '/v1/chat/completions', post(JSON.stringify(chatReq('x'.repeat(40000)))), 413],
  ];
  for (const [name, route, init, want] of cases) {
    const r = await status(route, init);
    assert.equal(r.status, want, `${name}: ${r.body}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string' && r.json.error.message.length > 0,
              `${name}: ${r.body}`);
  }
  const ctx = await status('/v1/chat/completions', post(JSON.stringify(chatReq('x', { max_tokens: 100000 }))));
  assert.equal(ctx.json.error.code, 'context_length_exceeded');
  assert.equal(ctx.json.error.param, 'max_tokens');
  // the client library raises its typed errors
  await assert.rejects(client.chat.completions.create(chatReq('x', { max_tokens: 100000 })), (e) => e.status === 400);
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
  const health = await status('/health');
  assert.equal(health.status, 200);
});

async function metrics() {
  return (await fetch(`${base}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } })).text();
}
const metric = (text, name) => Number((text.match(new RegExp(`^${name} (\\S+)$`, 'm')) || [])[1]);

// /metrics once no sequence runs and no KV block is held (polled for up to 10 s), checked
async function settled() {
  let m = '';
  for (let i = 0; i < 100; ++i) {
    m = await metrics();
    if (metric(m, 'nf4flash_sequences_running') === 0 && metric(m, 'nf4flash_kv_blocks_used') === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(metric(m, 'nf4flash_sequences_running'), 0, m);
  assert.equal(metric(m, 'nf4flash_kv_blocks_used'), 0, m);
  return m;
}

await check('a dropped stream ends its sequence and frees its blocks', async () => {
  const generated = metric(await metrics(), 'nf4flash_generation_tokens_total');
  const ac = new AbortController();
  const s = await client.chat.completions.create({ ...chatReq('Write a long poem', { max_tokens: 220 }), stream: true },
                                                 { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of s) {
      if (++n === 2) ac.abort();
    }
  } catch (e) {
    // the abort surfaces here
  }
  const m = await settled();
  // cancelled, not run to its end (the fixture does not stop early on this prompt: see the stream above)
  assert.ok(metric(m, 'nf4flash_generation_tokens_total') - generated < 220, m);
});
await check('a dropped non-stream request ends its sequences and frees their blocks', async () => {
  const generated = metric(await metrics(), 'nf4flash_generation_tokens_total');
  const ac = new AbortController();
  setTimeout(() => ac.abort(), 100);
  // 4 choices of up to 220 tokens: the reply takes far longer than the 100 ms before the abort
  await assert.rejects(client.chat.completions.create({ ...chatReq('Write a long poem', { max_tokens: 220 }), n: 4 },
                                                      { signal: ac.signal, maxRetries: 0 }));
  const m = await settled();
  assert.ok(metric(m, 'nf4flash_generation_tokens_total') - generated < 4 * 220, m);
  assert.match(m, /nf4flash_requests_total\{endpoint="\/v1\/chat\/completions",status="499"\} 1/);
});
await check('the same requests again give the same text', async () => {
  assert.equal(await chatText('Hello there, how are you?'), first);
  assert.equal((await streamText('Hello there, how are you?')).text, first);
});
await check('a second chat turn reuses the first turn from the prefix cache', async () => {
  const before = metric(await metrics(), 'nf4flash_prompt_tokens_cached_total');
  const sys = { role: 'system', content: 'You are a helpful assistant who answers in short sentences, always.' };
  const t1 = [sys, { role: 'user', content: 'What is the capital of France? Please answer briefly and clearly.' }];
  const a1 = await client.chat.completions.create({ model: modelId, messages: t1, temperature: 0, max_tokens: 8 });
  const t2 = [...t1, { role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'And of Italy?' }];
  const a2 = await client.chat.completions.create({ model: modelId, messages: t2, temperature: 0, max_tokens: 8 });
  assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= 8, JSON.stringify(a2.usage));
  const m = await metrics();
  assert.ok(metric(m, 'nf4flash_prompt_tokens_cached_total') > before, m);
  assert.match(m, /# TYPE nf4flash_time_to_first_token_seconds histogram/);
  assert.match(m, /nf4flash_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} \d+/);
  assert.match(m, /nf4flash_requests_total\{endpoint="\/v1\/chat\/completions",status="400"\} \d+/);
});
await check('main server stops on SIGTERM with exit code 0', async () => {
  assert.equal(await stop(main), 0, main.log());
});

// ---- the tight server: queue full, shutdown while streaming --------------------------------------
const tight = await start(['--max-batch', '1', '--max-waiting', '1', '--ignore-eos', '--ctx-size', '256',
                           '--shutdown-grace', '30']);
const tbase = `http://127.0.0.1:${tight.port}`;
const tclient = new OpenAI({ baseURL: `${tbase}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
await check('a full queue answers 429 with Retry-After', async () => {
  const body = JSON.stringify({ model: modelId, prompt: 'Once', max_tokens: 200, temperature: 0 });
  const send = () => fetch(`${tbase}/v1/completions`, { method: 'POST', body, headers: { 'Content-Type': 'application/json' } });
  const rs = await Promise.all([send(), send(), send(), send()]);
  const codes = rs.map((r) => r.status).sort();
  assert.ok(codes.includes(429), `statuses ${codes}`);
  assert.ok(codes.includes(200), `statuses ${codes}`);
  const r429 = rs.find((r) => r.status === 429);
  assert.ok(Number(r429.headers.get('retry-after')) >= 1);
  const j = await r429.json();
  assert.equal(j.error.type, 'rate_limit_error');
  for (const r of rs) if (r.status === 200) assert.equal((await r.json()).usage.completion_tokens, 200);
});
await check('SIGTERM lets a running stream finish, then exit 0', async () => {
  const s = await tclient.chat.completions.create({ ...chatReq('Go on', { max_tokens: 60 }), stream: true });
  let text = '', n = 0, finish = null, signalled = false;
  const exited = new Promise((resolve) => tight.on('exit', resolve));
  for await (const c of s) {
    if (c.choices.length) {
      text += c.choices[0].delta.content ?? '';
      if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
    }
    if (++n === 3 && !signalled) {
      signalled = true;
      tight.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 100));
      const h = await fetch(`${tbase}/health`).catch(() => null);
      if (h) assert.equal(h.status, 503);
      const late = await fetch(`${tbase}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                            body: JSON.stringify({ prompt: 'x', max_tokens: 2 }) }).catch(() => null);
      if (late) assert.equal(late.status, 503);
    }
  }
  assert.equal(finish, 'length');
  assert.equal(await exited, 0, tight.log());
});

// ---- tensor parallel: the same model over two ranks ---------------------------------------------
const tp = await start(['--tp', '2', '--max-batch', '4', '--ctx-size', '256', '--block-size', '8']);
const tpclient = new OpenAI({ baseURL: `http://127.0.0.1:${tp.port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60_000 });
await check('--tp 2 gives the main server\'s reply, stream and not', async () => {
  const r = await tpclient.chat.completions.create(chatReq('Hello there, how are you?'));
  assert.equal(r.choices[0].message.content, first);
  const s = await tpclient.chat.completions.create({ ...chatReq('Hello there, how are you?'), stream: true });
  let text = '';
  for await (const c of s) if (c.choices.length) text += c.choices[0].delta.content ?? '';
  assert.equal(text, first);
});
await check('--tp 2: 4 concurrent streams each equal their solo reply', async () => {
  const prompts = Array.from({ length: 4 }, (_, i) => `Question number ${i}: what is ${i} plus ${i * 3}?`);
  const solo = [];
  for (const p of prompts) solo.push((await tpclient.chat.completions.create(chatReq(p, { max_tokens: 16 }))).choices[0].message.content);
  const got = await Promise.all(prompts.map(async (p) => {
    const s = await tpclient.chat.completions.create({ ...chatReq(p, { max_tokens: 16 }), stream: true });
    let text = '';
    for await (const c of s) if (c.choices.length) text += c.choices[0].delta.content ?? '';
    return text;
  }));
  got.forEach((g, i) => assert.equal(g, solo[i], `stream ${i}`));
});
await check('--tp 2 server stops on SIGTERM with exit code 0', async () => {
  assert.equal(await stop(tp), 0, tp.log());
});

clearTimeout(deadline);
if (failures) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('all serve checks passed');
