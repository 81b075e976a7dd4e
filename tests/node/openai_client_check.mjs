// The official openai npm package against a running coli-serve (issue 32):
// a models list, a streaming chat, the same chat not streamed, a text
// completion. Prints one JSON object with what it got; exits 1 on any
// client error. Run by ColiServe.TheOpenaiNodeClientTalksToIt
// (tests/tool_test.cpp): node openai_client_check.mjs BASE_URL API_KEY MESSAGES_JSON
import OpenAI from 'openai';

const [base, apiKey, messagesJson] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0, timeout: 60000 });
const messages = JSON.parse(messagesJson);
try {
  const models = await client.models.list();
  const model = models.data[0].id;
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stream: true,
                                                        stream_options: { include_usage: true } });
  let streamed = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    streamed += chunk.choices[0].delta?.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  const completion = await client.completions.create({ model, prompt: 'Once upon', max_tokens: 6, temperature: 0 });
  console.log(JSON.stringify({ model, streamed, finish, usage, chat: chat.choices[0].message.content, chat_usage: chat.usage,
                               completion: completion.choices[0].text }));
} catch (e) {
  console.error(`openai client: ${e.status ?? ''} ${e.message}`);
  process.exit(1);
}
