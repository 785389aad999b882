// A Node.js client of salon's public Chat API on TypeScript stubs generated from protos/ by ts-proto
// (`cd protos && ../tools/node_modules/.bin/buf generate`, see protos/buf.gen.yaml), type-checked by tsc.
//
//   npx tsc -p clients/node && node clients/node/build/chat_stubs.js --target 127.0.0.1:50051 \
//     --api-key salon-dev-key "Hello there"
//
// Streams one greedy reply, then prints one JSON line `FINAL {...}` (finish reason, usage, token ids);
// on a gRPC error prints `ERROR <code name>: <details>` and exits 1.
import * as grpc from "@grpc/grpc-js";
import {
  ChatServiceClient,
  FinishReason,
  finishReasonToJSON,
  GenerateRequest,
  GenerateResponse,
  Role,
} from "./gen/salon/chat/v1/chat.js";

interface Args {
  target: string;
  apiKey: string;
  conversationId: string;
  maxNewTokens: number;
  text: string;
}

function parseArgs(argv: string[]): Args {
  const args: Args = { target: "127.0.0.1:50051", apiKey: "salon-dev-key", conversationId: `ts-${Date.now()}`,
                       maxNewTokens: 16, text: "Hello!" };
  const rest: string[] = [];
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
const client = new ChatServiceClient(args.target, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
metadata.set("authorization", `Bearer ${args.apiKey}`);

const request: GenerateRequest = GenerateRequest.fromPartial({
  conversationId: args.conversationId,
  character: { name: "Ada", definition: "Ada is a friendly engineer who answers briefly." },
  dialogue: { messages: [{ role: Role.ROLE_USER, author: "node", text: args.text }] },
  sampling: { maxNewTokens: args.maxNewTokens, temperature: 0 },
});

const tokenIds: number[] = [];
const call = client.generate(request, metadata);
call.on("data", (event: GenerateResponse) => {
  if (event.delta) {
    tokenIds.push(...event.delta.tokenIds);
    process.stdout.write(event.delta.text);
  } else if (event.final) {
    const reason: FinishReason = event.final.finishReason;
    process.stdout.write("\n");
    console.log("FINAL " + JSON.stringify({
      finish_reason: finishReasonToJSON(reason),
      usage: event.final.usage,
      engine_id: event.final.engineId,
      token_ids: tokenIds,
    }));
  }
});
call.on("error", (err: grpc.ServiceError) => {
  console.log(`ERROR ${grpc.status[err.code]}: ${err.details}`);
  client.close();
  process.exit(1);
});
call.on("end", () => client.close());
