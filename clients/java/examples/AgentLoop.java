import com.google.gson.Gson;
import dev.ctxfold.client.CtxfoldClient;
import dev.ctxfold.client.ModelTools;
import dev.ctxfold.client.PrepareOptions;
import dev.ctxfold.client.SessionSettings;
import dev.ctxfold.client.ToolFormat;
import dev.ctxfold.client.View;
import dev.ctxfold.client.adapters.OpenAiChat;
import dev.ctxfold.client.adapters.ProviderTurn;
import dev.ctxfold.v1.Message;
import dev.ctxfold.v1.Role;
import dev.ctxfold.v1.Session;
import dev.ctxfold.v1.ToolCall;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * The README's agent loop: replays a recorded agent trace (OpenAI chat format, like the
 * repository's tests/data/traces) through ctxfold. Before every model call it prepares the view,
 * converts it with the OpenAI Chat adapter, lets a fake model answer with the recorded assistant
 * message, appends that answer through the adapter, reports the usage and feeds the recorded tool
 * results into the next prepare. The first time the view shows a shortened tool result, the fake
 * model reads it with the read_tool_result tool, answered by the dispatcher.
 *
 *   java AgentLoop 127.0.0.1:50051 trace.json [window]
 */
public final class AgentLoop {
  private static final Gson JSON = new Gson();

  public static void main(String[] args) throws Exception {
    Map<?, ?> trace = JSON.fromJson(Files.readString(Path.of(args[1])), Map.class);
    List<?> recorded = (List<?>) trace.get("messages");
    List<Message> transcript = OpenAiChat.fromMessages(recorded);
    List<Object> tools = new ArrayList<>((List<?>) trace.get("tools"));
    tools.addAll(ModelTools.definitions(ToolFormat.OPENAI_CHAT));
    long window = args.length > 2 ? Long.parseLong(args[2]) : 8_000;

    try (CtxfoldClient client = CtxfoldClient.connect(args[0])) {
      Session session = client.createSession(SessionSettings.builder()
          .contextWindow(window)
          .toolContentMaxBytes(4_096)
          .systemPrompt(transcript.get(0).getContent())
          .toolsJson(JSON.toJson(tools))
          .build());
      String id = session.getId();
      System.out.printf("session %s: replaying %d recorded messages in a %d-token window%n",
          id, transcript.size(), window);

      List<Message> pending = new ArrayList<>(); // the new input of the next model call
      boolean readResult = true; // the fake model reads one shortened result itself
      for (int i = 1; i < transcript.size(); i++) {
        if (transcript.get(i).getRole() != Role.ROLE_ASSISTANT) {
          pending.add(transcript.get(i));
          continue;
        }
        for (boolean answered = false; !answered; ) {
          View view = client.prepare(id, PrepareOptions.builder()
              .append(pending)
              .onProgress(p -> System.out.printf("  %s %d -> %d tokens %s%n",
                  p.getStage(), p.getTokensBefore(), p.getTokensAfter(), p.getMessage()))
              .build());
          Map<String, Object> request = OpenAiChat.request(view);
          request.put("model", "recorded-model");
          request.put("tools", tools);

          String shortened = readResult ? shortenedResult(view) : null;
          answered = shortened == null;
          readResult &= answered;
          ProviderTurn turn = OpenAiChat.response(fakeModel(view, answered ? recorded.get(i) : readCall(shortened)));

          client.appendMessages(id, turn.messages(), "");
          client.observeUsage(id, view, turn.usage());
          System.out.printf("turn %3d: %2d messages, %5d tokens, %s%n",
              i, view.messages().size(), view.estimatedTokens(), view.action());
          pending = new ArrayList<>();
          for (ToolCall call : turn.toolCalls()) {
            if (ModelTools.handles(call.getName())) { // the model asked ctxfold itself
              String answer = client.dispatchToolCall(id, call.getName(), call.getArguments()).orElseThrow();
              System.out.printf("  %s(%s) answered with %d bytes%n", call.getName(), call.getArguments(),
                  answer.length());
              pending.add(Message.newBuilder().setRole(Role.ROLE_TOOL).setToolCallId(call.getId())
                  .setContent(answer).build());
            }
          }
        }
      }
    }
  }

  /** The result_ref of a tool result the view shows shortened (truncated or pruned), or null. */
  private static String shortenedResult(View view) {
    return view.messages().stream()
        .filter(m -> (m.getTruncated() || m.getPruned()) && !m.getResultRef().isEmpty())
        .map(Message::getResultRef).findFirst().orElse(null);
  }

  /** An assistant message calling read_tool_result on {@code resultRef}. */
  private static Map<String, Object> readCall(String resultRef) {
    String arguments = JSON.toJson(Map.of("result_ref", resultRef, "offset", 0));
    return Map.of("role", "assistant", "tool_calls", List.of(Map.of("id", "call_read_1", "type", "function",
        "function", Map.of("name", ModelTools.READ_TOOL_RESULT, "arguments", arguments))));
  }

  /** The provider's answer: a Chat Completions response carrying {@code answer}. */
  private static String fakeModel(View view, Object answer) {
    boolean calls = ((Map<?, ?>) answer).get("tool_calls") != null;
    return JSON.toJson(Map.of(
        "choices", List.of(Map.of("message", answer, "finish_reason", calls ? "tool_calls" : "stop")),
        "usage", Map.of("prompt_tokens", view.estimatedTokens(), "completion_tokens", 50,
            "prompt_tokens_details", Map.of("cached_tokens", 0))));
  }
}
