import com.google.gson.Gson;
import dev.ctxfold.client.CtxfoldClient;
import dev.ctxfold.client.FoldProgress;
import dev.ctxfold.client.JsonText;
import dev.ctxfold.client.Message;
import dev.ctxfold.client.Messages;
import dev.ctxfold.client.ModelTools;
import dev.ctxfold.client.PrepareOptions;
import dev.ctxfold.client.Session;
import dev.ctxfold.client.SessionSettings;
import dev.ctxfold.client.ToolCall;
import dev.ctxfold.client.ToolFormat;
import dev.ctxfold.client.View;
import dev.ctxfold.client.adapters.OpenAiChat;
import dev.ctxfold.client.adapters.ProviderTurn;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * The ctxfold agent loop over a recorded trace: the same program in every SDK's README.
 *
 *   java AgentLoop TRACE.json [HOST:PORT]
 *
 * A recorded coding-agent run stands in for the model and its tools: each model call answers with
 * the trace's next assistant message (as an OpenAI Chat Completions response), and the recorded
 * tool outputs answer the tool calls. When the last tool result came back truncated, the fake model
 * first reads it with the read_tool_result tool, which the SDK's dispatcher answers.
 */
public final class AgentLoop {
  private static final Gson JSON = new Gson();

  static void printProgress(FoldProgress event) {
    if (event.summaryDelta().isEmpty()) {
      System.out.printf("  fold %s: %d -> %d tokens. %s%n",
          event.stage(), event.tokensBefore(), event.tokensAfter(), event.message());
    }
  }

  /** The fake model's token count: a quarter of the UTF-8 bytes of {@code value} as compact JSON. */
  static int tokens(Object value) {
    return JsonText.write(value).getBytes(StandardCharsets.UTF_8).length / 4;
  }

  /** A Chat Completions response: a read_tool_result call for a truncated last tool result, else
   *  the next recorded assistant message (taken off {@code turns}). */
  static String fakeModel(Map<String, Object> request, View view, List<Map<?, ?>> turns) {
    Message last = view.messages().get(view.messages().size() - 1);
    Map<?, ?> message;
    if (last.truncated() && !last.toolCallId().startsWith("read_")) {
      Map<String, Object> call = Map.of("id", "read_" + last.seq(), "type", "function", "function",
          Map.of("name", ModelTools.READ_TOOL_RESULT, "arguments", JSON.toJson(Map.of("result_ref", last.resultRef()))));
      Map<String, Object> read = new LinkedHashMap<>();
      read.put("role", "assistant");
      read.put("content", null);
      read.put("tool_calls", List.of(call));
      message = read;
    } else {
      message = turns.remove(0);
    }
    Map<String, Object> usage = Map.of("prompt_tokens", tokens(request), "completion_tokens", tokens(message));
    String finishReason = message.get("tool_calls") != null ? "tool_calls" : "stop";
    return JSON.toJson(Map.of("choices", List.of(Map.of("index", 0, "message", message,
        "finish_reason", finishReason)), "usage", usage));
  }

  public static void main(String[] args) throws Exception {
    Map<?, ?> trace = JSON.fromJson(Files.readString(Path.of(args[0])), Map.class);
    List<Map<?, ?>> recorded = new ArrayList<>();
    ((List<?>) trace.get("messages")).forEach(m -> recorded.add((Map<?, ?>) m));
    Map<Object, Object> outputs = new HashMap<>();
    List<Map<?, ?>> turns = new ArrayList<>();
    for (Map<?, ?> m : recorded.subList(1, recorded.size())) {
      if ("tool".equals(m.get("role"))) {
        outputs.put(m.get("tool_call_id"), m.get("content"));
      } else if ("user".equals(m.get("role")) || "assistant".equals(m.get("role"))) {
        turns.add(m);
      }
    }
    List<Object> tools = new ArrayList<>((List<?>) trace.get("tools"));
    tools.addAll(ModelTools.definitions(ToolFormat.OPENAI_CHAT));
    SessionSettings settings = SessionSettings.builder()
        .contextWindow(12_000)
        .maxOutputTokens(1_024)
        .toolContentMaxBytes(4_096)
        .systemPrompt((String) recorded.get(0).get("content"))
        .tools(tools) // written as every ctxfold SDK writes JSON, so the tools cost the same tokens
        .build();
    try (CtxfoldClient client = CtxfoldClient.connect(args.length > 1 ? args[1] : "127.0.0.1:50051")) {
      Session session = client.createSession(settings);
      System.out.printf("session %s: %d recorded turns%n", session.id(), turns.size());
      List<Message> pending = new ArrayList<>();
      View view = null;
      int calls = 0;
      int folds = 0;
      int reads = 0;
      while (!turns.isEmpty()) {
        if ("user".equals(turns.get(0).get("role"))) {
          pending.addAll(OpenAiChat.fromMessages(List.of(turns.remove(0))));
          continue;
        }
        view = client.prepare(session.id(),
            PrepareOptions.builder().append(pending).onProgress(AgentLoop::printProgress).build());
        folds += view.folded() ? 1 : 0;
        Map<String, Object> request = OpenAiChat.request(view, tools); // with the session's tools
        ProviderTurn reply = OpenAiChat.response(fakeModel(request, view, turns));
        client.observeUsage(session.id(), view, reply.usage());
        calls++;
        pending = new ArrayList<>(reply.messages());
        for (ToolCall call : reply.toolCalls()) {
          Optional<String> answer = client.dispatchToolCall(session.id(), call.name(), call.arguments());
          reads += answer.isPresent() ? 1 : 0;
          String output = answer.orElse((String) outputs.getOrDefault(call.id(), "(no output recorded)"));
          pending.add(Messages.toolResult(call.id(), output));
        }
      }
      client.appendMessages(session.id(), pending, "");
      System.out.printf("%d model calls, %d folds, %d read_tool_result calls; last view: %d messages, ~%d input tokens%n",
          calls, folds, reads, view.messages().size(), view.estimatedInputTokens());
    }
  }
}
