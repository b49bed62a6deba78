// Records the requests LibreChat sends to a custom OpenAI-compatible endpoint, for
// tests/fixtures/chat_clients. Not part of the test suite: it is how the fixture was made.
//
// LibreChat itself needs MongoDB, which does not install here; its model calls are made by its
// own library, @librechat/agents (v0.8.7 pins 3.2.46; 3.2.57 is the nearest on npm), which this
// script drives with the options LibreChat v0.8.7 passes for a custom endpoint
// (api/server/controllers/agents/client.js titleConvo, packages/api/src/endpoints/custom):
// a streamed chat request with the whole conversation, and the title request of the first
// message (titleTiming "immediate": the reply is not in it yet), by the default method
// "completion" and by "structured".
//
//   mkdir /tmp/lc && cd /tmp/lc && npm install @librechat/agents@3.2.57
//   cp tests/clients/record_librechat.mjs /tmp/lc/ && node /tmp/lc/record_librechat.mjs OUT.json
import http from 'node:http';
import fs from 'node:fs';
import { Run, Providers } from '@librechat/agents';
import { HumanMessage, AIMessage } from '@langchain/core/messages';

const out = process.argv[2] ?? 'librechat.json';
const requests = [];
let step = '';
const server = http.createServer((req, res) => {
  let body = '';
  req.on('data', (c) => (body += c));
  req.on('end', () => {
    const json = JSON.parse(body || '{}');
    const keep = ['content-type', 'accept'];
    const headers = Object.fromEntries(Object.entries(req.headers).filter(([k]) => keep.includes(k)));
    requests.push({ step, headers, body: json });
    const message = json.response_format
      ? { role: 'assistant', content: JSON.stringify({ language: 'English', title: 'Customer Count' }) }
      : { role: 'assistant', content: 'Customer Count' };
    if (json.stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (delta, finish = null) =>
        `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: json.model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
      res.write(chunk({ role: 'assistant', content: '1 row.' }));
      res.write(chunk({}, 'stop'));
      res.end('data: [DONE]\n\n');
    } else {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'c2', object: 'chat.completion', created: 1, model: json.model, choices: [{ index: 0, message, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
    }
  });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const baseURL = `http://127.0.0.1:${server.address().port}/v1`;
// getOpenAIConfig for a custom endpoint: the model, the LibreChat user id, streaming.
const base = { model: 'shop', user: '665f00000000000000000001', apiKey: 'sk-test', configuration: { baseURL } };
const run = await Run.create({
  runId: 'run-1',
  graphConfig: {
    type: 'standard',
    agents: [{ agentId: 'ephemeral', provider: Providers.OPENAI, clientOptions: { provider: Providers.OPENAI, streaming: true, streamUsage: false, usage: true, ...base }, instructions: '', useLegacyContent: true }],
  },
  customHandlers: {},
});
const config = { configurable: { thread_id: 'convo-1', user_id: 'u1' }, streamMode: 'values', version: 'v2', runId: 'run-1' };
const answer = '1 row.\n\n```sql\nSELECT count(*) AS customers FROM customers\n```\n\n| customers |\n|---|\n| 10 |';

step = 'first question';
await run.processStream({ messages: [new HumanMessage('How many customers are there?')] }, config);
for (const method of ['completion', 'structured']) {
  step = `title of the first question (titleMethod ${method})`;
  // titleConvo: the chat's options without the streaming and token options (omitTitleOptions)
  await run.generateTitle({
    provider: Providers.OPENAI, clientOptions: { ...base }, inputText: 'How many customers are there?', contentParts: [],
    titleMethod: method, chainOptions: { runName: 'TitleRun', callbacks: [{ handleLLMEnd() {} }], configurable: config.configurable },
  });
}
step = 'follow-up';
await run.processStream({ messages: [new HumanMessage('How many customers are there?'), new AIMessage(answer), new HumanMessage('And how many of them are from Germany?')] }, config);
server.close();
fs.writeFileSync(out, JSON.stringify({
  client: 'LibreChat v0.8.7 custom endpoint, as its library @librechat/agents 3.2.57 sends it',
  recorded: new Date().toISOString().slice(0, 10),
  how: 'tests/clients/record_librechat.mjs: @librechat/agents driven with the options LibreChat v0.8.7 passes, against a recording server',
  requests,
}, null, 1));
process.exit(0);
