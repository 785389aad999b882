// A Node.js client for salon's public Chat API: loads protos/ at runtime with @grpc/proto-loader
// (no generated code) and streams one reply from the gateway.
//
//   node clients/node/chat.mjs --target 127.0.0.1:50051 --api-key salon-dev-key "Hello there"
//
// Prints each text delta as it arrives, then one JSON line `FINAL {...}` with the finish reason,
// usage and the generated token ids. Exit code 0 on success, 1 on a gRPC error (printed as
// `ERROR <code name>: <details>`).
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
// The npm packages are installed once for the repo's tooling (tools/package.json).
const require = createRequire(path.join(repo, "tools", "package.json"));
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

function parseArgs(argv) {
  const args = { target: "127.0.0.1:50051", apiKey: "salon-dev-key", conversationId: `node-${Date.now()}`,
                 maxNewTokens: 16, text: "Hello!" };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--target") args.target = argv[++i];
    else if (a === "--api-key") args.apiKey = argv[++i];
    else if (a === "--conversation-id") args.conversationId = argv[++i];
    else if (a === "--max-new-tokens") args.maxNewTokens = Number(argv[++i]);
    else rest.push(a);
  }
  if (rest.length) args.text = rest.join(" ");
  return args;
}

const args = parseArgs(process.argv.slice(2));
const definition = protoLoader.loadSync("salon/chat/v1/chat.proto", {
  includeDirs: [path.join(repo, "protos")], keepCase: true, longs: Number, enums: String, defaults: true,
  oneofs: true,
});
const chat = grpc.loadPackageDefinition(definition).salon.chat.v1;
const client = new chat.ChatService(args.target, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
metadata.set("authorization", `Bearer ${args.apiKey}`);

const request = {
  conversation_id: args.conversationId,
  character: { name: "Ada", definition: "Ada is a friendly engineer who answers briefly." },
  dialogue: { messages: [{ role: "ROLE_USER", author: "node", text: args.text }] },
  sampling: { max_new_tokens: args.maxNewTokens, temperature: 0 },
};

const tokenIds = [];
const call = client.Generate(request, metadata);
call.on("data", (event) => {
  if (event.event === "delta") {
    tokenIds.push(...event.delta.token_ids);
    process.stdout.write(event.delta.text);
  } else if (event.event === "final") {
    const f = event.final;
    process.stdout.write("\nFINAL " + JSON.stringify({
      finish_reason: f.finish_reason, usage: f.usage, engine_id: f.engine_id, token_ids: tokenIds,
    }) + "\n");
  }
});
call.on("error", (err) => {
  process.stdout.write(`ERROR ${grpc.status[err.code]}: ${err.details}\n`);
  process.exitCode = 1;
});
call.on("end", () => client.close());
