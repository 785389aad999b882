// The official `openai` npm package against salon's OpenAI-compatible HTTP API: a chat completion
// streamed and not, the second turn's cached tokens, n = 2 with log-probs, a stop string, penalties and
// vLLM's sampling extensions, and the error statuses (401, 404, 400; 429 with --limited-api-key, a tenant
// allowed one request; 503 with --dead-base-url, a gateway without a live engine). Prints one line
// `RESULT {...}` with what it saw (tests/openai/test_stubs_and_node_clients.py checks it).
//
//   node clients/node/openai_chat.mjs --base-url http://127.0.0.1:8000/v1 --api-key KEY --model MODEL \
//     [--limited-api-key KEY2] [--dead-base-url URL]
import OpenAI from "openai";

function parseArgs(argv) {
  const args = { baseURL: "http://127.0.0.1:8000/v1", apiKey: "salon-dev-key", model: "gemma-3-270m",
                 limitedApiKey: null, deadBaseURL: null };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--base-url") args.baseURL = argv[++i];
    else if (argv[i] === "--api-key") args.apiKey = argv[++i];
    else if (argv[i] === "--model") args.model = argv[++i];
    else if (argv[i] === "--limited-api-key") args.limitedApiKey = argv[++i];
    else if (argv[i] === "--dead-base-url") args.deadBaseURL = argv[++i];
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const client = new OpenAI({ baseURL: args.baseURL, apiKey: args.apiKey, maxRetries: 0 });
const messages = [
  { role: "system", content: "You are Ada, a lighthouse keeper." },
  { role: "user", content: "Hello from Node! How is the sea tonight?" },
];
const greedy = { model: args.model, max_tokens: 10, temperature: 0 };
const result = {};

const whole = await client.chat.completions.create({ ...greedy, messages });
result.whole = { text: whole.choices[0].message.content, finish_reason: whole.choices[0].finish_reason,
                 usage: whole.usage, object: whole.object };

const stream = await client.chat.completions.create({ ...greedy, messages, stream: true,
                                                       stream_options: { include_usage: true } });
let text = "";
let usage = null;
let finish = null;
for await (const chunk of stream) {
  for (const choice of chunk.choices) {
    text += choice.delta?.content ?? "";
    finish = choice.finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
result.stream = { text, finish_reason: finish, usage };

const second = await client.chat.completions.create({ ...greedy, messages: [
  ...messages, { role: "assistant", content: whole.choices[0].message.content },
  { role: "user", content: "And the lamp?" }] });
result.second_turn_cached_tokens = second.usage.prompt_tokens_details?.cached_tokens ?? null;

const several = await client.chat.completions.create({ model: args.model, messages, max_tokens: 6, temperature: 0,
                                                       n: 2, logprobs: true, top_logprobs: 2 });
result.n2 = several.choices.map((c) => ({
  index: c.index, text: c.message.content,
  logprobs: c.logprobs.content.map((e) => ({
    token: e.token, logprob: e.logprob, top: e.top_logprobs.map((t) => [t.token, t.logprob]) })),
}));
const cutAt = whole.choices[0].message.content.slice(3, 6);
const stopped = await client.chat.completions.create({ ...greedy, messages, stop: [cutAt] });
result.stop = { stop: cutAt, text: stopped.choices[0].message.content, finish_reason: stopped.choices[0].finish_reason };

// The penalties and vLLM's extensions (top_k, min_p, repetition_penalty) travel in the request body.
const penalized = await client.chat.completions.create({ model: args.model, messages, max_tokens: 4, temperature: 0.7,
  seed: 3, presence_penalty: 0.5, frequency_penalty: 0.3, repetition_penalty: 1.1, min_p: 0.05, top_k: 20 });
result.penalties = { completion_tokens: penalized.usage.completion_tokens,
                     finish_reason: penalized.choices[0].finish_reason };

async function status(fn) {
  try {
    await fn();
    return { status: 200 };
  } catch (err) {
    if (!(err instanceof OpenAI.APIError)) throw err;
    return { status: err.status, param: err.param ?? null, code: err.code ?? null, type: err.type ?? null,
             message: err.error?.message ?? null, keys: Object.keys(err.error ?? {}).sort(),
             retry_after: err.headers?.get?.("retry-after") ?? null };
  }
}
result.errors = {
  unauthenticated: await status(() => new OpenAI({ baseURL: args.baseURL, apiKey: "sk-wrong-key-000", maxRetries: 0 })
    .chat.completions.create({ ...greedy, messages })),
  unknown_model: await status(() => client.chat.completions.create({ ...greedy, model: "gpt-4o", messages })),
  bad_field: await status(() => client.chat.completions.create({ ...greedy, messages, temperature: 9 })),
  bad_penalty: await status(() => client.chat.completions.create({ ...greedy, messages, presence_penalty: 3 })),
  bad_extension: await status(() => client.chat.completions.create({ ...greedy, messages, min_p: 1.5 })),
  unsupported: await status(() => client.chat.completions.create({ ...greedy, messages,
    functions: [{ name: "f" }] })),
};
if (args.limitedApiKey) {
  const limited = new OpenAI({ baseURL: args.baseURL, apiKey: args.limitedApiKey, maxRetries: 0 });
  await status(() => limited.chat.completions.create({ ...greedy, max_tokens: 1, messages }));
  result.errors.rate_limited = await status(() => limited.chat.completions.create({ ...greedy, max_tokens: 1,
                                                                                     messages }));
}
if (args.deadBaseURL) {
  result.errors.no_engine = await status(() => new OpenAI({ baseURL: args.deadBaseURL, apiKey: args.apiKey,
                                                            maxRetries: 0 }).chat.completions.create({ ...greedy, messages }));
}
console.log("RESULT " + JSON.stringify(result));
